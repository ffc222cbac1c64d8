"""Small-batch float32 linears through MKL's packed GEMM (kernels/cpu_mkl.cpp), opt-in.

With ``KVSCOPE_CPU_MKL_PACKED=1``, ``engine/model/layers.PackedWeightCache`` packs each
linear weight once with ``cblas_sgemm_pack`` and multiplies 4-64 rows by it with
``cblas_sgemm_compute``, where this extension builds and torch carries MKL (its x86
wheels do). It was the default from 2026-12-02 (every linear weight of SmolLM2-135M
once, 2 threads, ms: 16 rows 47-48 MKL packed vs 55-58 oneDNN packed vs 74-75
``F.linear``; 64 rows 97 vs 112-132 vs 135-149). On 2026-12-06, with torch 2.13's
oneDNN, oneDNN's packing took 0.4x MKL's CPU time at 4-16 rows and 0.63x at 64, and a
decode step of 16 sequences 0.56x (bench/RESULTS.md, issue 33), so oneDNN's packing is
the default now, for every row count. The product equals ``F.linear``'s to float32 rounding (bitwise at most
row counts of 16 and more). A/B in one engine: ``python -m bench.step_ab onednn``.
"""

from __future__ import annotations

import torch

from kernels.cpu_build import DefaultPathKernels

KERNELS = DefaultPathKernels("cpu_mkl.cpp", "KVSCOPE_CPU_MKL_PACKED",
                             "small-batch linears use oneDNN's packed weights instead of MKL's")
extension = KERNELS.module  # raises KernelUnavailableError when it cannot be built

PACK_ROWS = 64  # the row count MKL lays the weight out for (any count multiplies exactly)

_usable: bool | None = None


def usable() -> bool:
    """True when the extension is on, builds, and this torch carries MKL's packed GEMM."""
    global _usable
    if not KERNELS.enabled():
        return False
    if _usable is None:
        _usable = bool(extension().available())
    return _usable


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (float32, CPU) in MKL's packed layout; keep it where it is."""
    return extension().pack(weight.detach().contiguous(), PACK_ROWS)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for x [M, K] with ``packed = pack(weight)``."""
    return extension().linear(x, packed, out_features, bias)

"""Reduced-precision weights for CPU linears: int8 (grouped scales) or bfloat16 storage,
float32 compute. Optional (``quantization="int8"`` / ``dtype="bfloat16"`` on the CPU),
never the default.

Why: a batch-1 decode step reads every weight once and does two FLOPs with it, so its
speed is the memory bandwidth over the weight bytes. Stored as int8 (1 byte + a float32
scale per 32 weights: 1.125 bytes) or bf16 (2 bytes) instead of float32 (4), the same
step reads 3.6x or 2x fewer bytes. The activations, every product and every sum stay
float32: weights are widened in registers (kernels/cpu_linear.cpp).

- Few rows (decode): the C++ kernel reads each weight row once for all rows of x.
- Many rows (prefill): the weight is dequantized into a reused float32 scratch matrix
  and multiplied by F.linear (MKL), which is faster there than the kernel's loop.

int8 quantization is symmetric per group of 32 consecutive weights along K (as
llama.cpp's Q8_0): scale = max |w| / 127, q = round(w / scale). Weights that came
from a Q8_0 tensor (SmolLM2's embeddings, tied to its lm_head) come back exactly.

The extension is compiled on first use (torch.utils.cpp_extension; needs a C++
compiler and ninja; ~1 minute, then cached under ~/.cache/torch_extensions).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

GROUP = 32
# Up to this many rows the kernel beats dequantize + F.linear: every linear weight of
# SmolLM2 once, 1 thread, CPU ms (box loaded): int8 at 8 rows 71 (kernel) vs 162, at 16
# 145 vs 166, at 32 344 vs 231; bf16 at 8 95 vs 176, at 16 180 vs 169.
INT8_KERNEL_MAX_ROWS = 16
BF16_KERNEL_MAX_ROWS = 12

_ext = None
_ext_lock = threading.Lock()


class KernelUnavailableError(RuntimeError):
    """The C++ kernels could not be built or loaded here."""


def extension():
    """The compiled kernels (built once per machine, then loaded from the cache)."""
    global _ext
    if _ext is None:
        with _ext_lock:
            if _ext is None:
                from torch.utils import cpp_extension

                src = Path(__file__).with_name("cpu_linear.cpp")
                try:
                    _ext = cpp_extension.load(name="kvscope_cpu_linear", sources=[str(src)],
                                              extra_cflags=["-O3", "-march=native"], verbose=False)
                except Exception as exc:  # noqa: BLE001 (compiler missing, build error, ...)
                    raise KernelUnavailableError(
                        f"reduced-precision CPU weights need the C++ kernels in {src.name}, which failed "
                        f"to build ({type(exc).__name__}: {exc}); they need a C++ compiler and ninja. "
                        "Use the default float32 weights instead.") from exc
    return _ext


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 scales [N, K / 32]) for a float [N, K] weight, K % 32 == 0."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int8 weights need in_features divisible by {GROUP}, got {k}")
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    scales = groups.abs().amax(dim=-1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(groups / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(n, k).contiguous(), scales.contiguous()


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight an int8 weight stands for (exactly what the kernels use)."""
    n, k = q.shape
    return (q.reshape(n, k // GROUP, GROUP).float() * scales[..., None]).reshape(n, k)


class _Scratch:
    """One reused float32 matrix per weight shape, for the many-rows path. Per thread,
    so two engines in one process never share one mid-GEMM."""

    _local = threading.local()

    @classmethod
    def get(cls, shape: tuple[int, int]) -> torch.Tensor:
        bufs = getattr(cls._local, "bufs", None)
        if bufs is None:
            bufs = cls._local.bufs = {}
        buf = bufs.get(shape)
        if buf is None:
            buf = bufs[shape] = torch.empty(shape)
        return buf


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """An int8 weight with grouped scales; written once by ``from_float``."""

    q: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # float32 [N, K / 32]

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int8Weight":
        return cls(*quantize_int8(weight))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        return self.q.numel() * self.q.element_size() + self.scales.numel() * self.scales.element_size()

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8(self.q, self.scales)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[0] <= INT8_KERNEL_MAX_ROWS:
            return extension().int8_linear(x, self.q, self.scales, bias)
        w = _Scratch.get(self.shape)
        extension().int8_dequantize(self.q, self.scales, w)
        return F.linear(x, w, bias)


@dataclass(frozen=True, eq=False)
class BF16Weight:
    """A bfloat16 weight computed in float32; written once by ``from_float``."""

    w: torch.Tensor  # bfloat16 [N, K]

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "BF16Weight":
        return cls(weight.detach().to(torch.bfloat16).contiguous())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def dequantize(self) -> torch.Tensor:
        return self.w.float()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[0] <= BF16_KERNEL_MAX_ROWS:
            return extension().bf16_linear(x, self.w, bias)
        w = _Scratch.get(self.shape)
        w.copy_(self.w)  # bf16 -> float32 widening is exact
        return F.linear(x, w, bias)


WEIGHT_FORMATS = {"int8": Int8Weight, "bfloat16": BF16Weight}

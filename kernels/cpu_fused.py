"""Fused elementwise ops of a decoder layer for the CPU (kernels/cpu_fused.cpp): SiLU
times up, rotary embedding, residual add + RMSNorm, each one pass instead of a chain of
small torch ops.

Used by engine/model/layers.py and llama.py for float32 CPU tensors when the extension
builds here; otherwise (or with ``KVSCOPE_CPU_FUSED=0``, for A/B runs: ``python -m
bench.step_ab fused``) the torch ops run. silu_mul and rope give bitwise torch's
results; add_rms_norm sums the squares in another order (~1 ulp in the scale).
silu_mul's input and output and add_rms_norm's ``x`` and output may be bfloat16 (the bf16
weights' GEMM inputs and outputs: kernels/cpu_linear.py); the arithmetic stays float32.
"""

from __future__ import annotations

import torch

from kernels.cpu_build import DefaultPathKernels

# -ffp-contract=off: no multiply-add is fused, so every product rounds as torch's does
KERNELS = DefaultPathKernels("cpu_fused.cpp", "KVSCOPE_CPU_FUSED", "CPU layers fall back to torch's elementwise ops",
                             ("-ffp-contract=off",))
extension = KERNELS.module  # the compiled ops; raises KernelUnavailableError when they cannot be built
fused_enabled = KERNELS.enabled  # on unless KVSCOPE_CPU_FUSED=0, if they build


def applies(*tensors: torch.Tensor) -> bool:
    """True when the fused ops are on and take these tensors (float32, CPU). Called a few
    times a layer per decode step: a plain loop over ``is_cpu`` (``t.device`` builds an
    object; the generator and ``all`` cost more than the checks), ~0.4 us instead of 1.8."""
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return fused_enabled()


def applies_bf16(*tensors: torch.Tensor) -> bool:
    """``applies``, bfloat16 tensors accepted too (silu_mul's input, add_rms_norm's x)."""
    for t in tensors:
        if (t.dtype != torch.float32 and t.dtype != torch.bfloat16) or not t.is_cpu:
            return False
    return fused_enabled()


def silu_mul(gate_up: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] (gate first) -> [T, I] of ``out_dtype``."""
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=out_dtype)
    extension().silu_mul(gate_up, out)
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, hd] * cos + swap_halves(x) * signed_sin (both [T, hd]) -> contiguous."""
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # 1 us less than torch.empty(x.shape)
    extension().rope(x, cos, signed_sin, out)
    return out


def add_rms_norm(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """residual += x (in place, if x is given); returns rms_norm(residual) * weight as ``out_dtype``."""
    out = torch.empty_like(residual, dtype=out_dtype, memory_format=torch.contiguous_format)
    extension().add_rms_norm(x, residual, weight, float(eps), out)
    return out

"""Reduced-precision weights for CPU linears: int8 (grouped scales) or bfloat16 storage,
float32 compute (but for bfloat16 GEMMs of 2+ rows, below). Optional (``quantization="int8"`` / ``dtype="bfloat16"`` on the CPU),
never the default.

Why: a batch-1 decode step reads every weight once and does two FLOPs with it, so its
speed is the memory bandwidth over the weight bytes. Stored as int8 (1 byte + a float32
scale and offset per 32 weights: 1.25 bytes) or bf16 (2 bytes) instead of float32 (4),
the same step reads 3.2x or 2x fewer bytes. The activations, every product and every sum stay
float32: weights are widened in registers (kernels/cpu_linear.cpp).

- Few rows (decode): the C++ kernel reads each weight row once for all rows of x.
- Many rows (prefill): the weight is dequantized into a reused float32 scratch matrix
  and multiplied by F.linear (MKL), which is faster there than the kernel's loop.
- bfloat16 where the CPU multiplies bf16 natively (AVX512-BF16, AMX; oneDNN through
  torch.ops.mkldnn): from 2 rows the input is rounded to bf16 and oneDNN multiplies it by
  a packed copy of the weight, summing in float32 (~2x less time at 16 rows, ~2-5x at 512,
  as vLLM's CPU build computes in bf16). The rounding of the input is this path's
  accuracy cost (bench/RESULTS.md, session 21); one row (batch-1 decode) stays float32.

int8 quantization works per group of 32 consecutive weights along K, w = q * scale +
offset with q in [-128, 127], each group taking the better (smaller largest error) of:

- symmetric, as llama.cpp's Q8_0: scale = max |w| / 127, offset 0;
- affine, as Q4_1 / Q8_1: scale = (max - min) / 255, offset = min + 128 * scale.

So weights that came from a GGUF come back (almost) exactly: a Q8_0 group (SmolLM2's
embeddings, tied to its lm_head) is scale * q already, and a Q4_1 group (its other
linears) holds 16 levels d apart from min to min + 15 d, which an affine step of
15 d / 255 = d / 17 hits on every 17th level (up to float rounding).

w8a8 (``quantization="w8a8"``, opt-in, never the default) stores the same int8 weights
in a layout for AVX512-VNNI and, at up to 16 rows, also rounds each linear's input to int8
per group of 32 (d = max |x| / 127, as llama.cpp's Q8 activations) so that each group's
dot product is one exact integer from vpdpbusd: ~2.2-3.5x less CPU per weight than the
int8 kernel, for a measured accuracy cost (bench/RESULTS.md: logits move by ~1% of their
range, where int8's move by 2e-6). On a CPU without VNNI it gives the int8 format.

The extension is compiled on first use (kernels/cpu_build.py: torch.utils.cpp_extension;
needs a C++ compiler and ninja; ~30-60 s, then cached in the venv under kvscope-kernels/).
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import cpu_build

logger = logging.getLogger(__name__)

GROUP = 32
# Up to this many rows the kernel beats dequantize + F.linear: every linear weight of
# SmolLM2 once, 1 thread, CPU ms (box loaded): int8 at 8 rows 71 (kernel) vs 162, at 16
# 145 vs 166, at 32 344 vs 231; bf16 at 8 95 vs 176, at 16 180 vs 169.
INT8_KERNEL_MAX_ROWS = 16
BF16_KERNEL_MAX_ROWS = 12
# Where oneDNN multiplies bfloat16 natively (AMX here), it takes the bfloat16 format from 2
# rows: every linear weight of SmolLM2 once, 2 threads, wall ms, 2026-12-07 (quiet box),
# kernel / oneDNN (input rounded to bf16, output widened): 1 row 12.2 / 12.5, 2 13.0 / 12.6,
# 4 17.0 / 12.8, 8 25.6 / 13.2, 16 30.0 / 14.0; 512 rows F.linear on the widened weight
# ~357 / oneDNN ~168. One row stays on the kernel: float32 products, as fast.
BF16_ONEDNN_MIN_ROWS = 2
ONEDNN_BATCH_HINT = 16  # the row count oneDNN lays a packed weight out for (here and engine/model/layers.py)
# float32 weights, the default format: up to this many rows (decode steps) the kernel's
# f32_linear multiplies the plain [N, K] weight, streaming it while it computes; oneDNN's
# packed GEMM takes more rows. By the kernel's vector width (f32_linear_lanes: 16 AVX-512,
# 8 AVX2), where it stops winning (figures in kernels/cpu_linear.cpp: ~96 rows with
# AVX-512, 40-48 with AVX2). A build with neither has only a scalar loop, ~10x slower than
# oneDNN, and oneDNN keeps every row count.
F32_KERNEL_MAX_ROWS = {16: 64, 8: 32}
# the one build of kernels/cpu_linear.cpp (extension() below loads it too); -ffp-contract=off:
# q * scale + offset stays a multiply then an add, the same two roundings as dequantize_int8
F32_KERNELS = cpu_build.DefaultPathKernels(
    "cpu_linear.cpp", "KVSCOPE_CPU_F32_LINEAR", "float32 CPU linears of few rows fall back to oneDNN",
    ("-ffp-contract=off",),
    lambda module: None if module.f32_linear_lanes() in F32_KERNEL_MAX_ROWS else
    "f32_linear has no vector path for this CPU (neither AVX-512 nor AVX2)")


def f32_kernel_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``f32_linear`` multiplies these: the kernels built, on and vectorized here,
    float32 CPU x of 1..f32_kernel_max_rows() contiguous rows, a contiguous weight."""
    return (F32_KERNELS.enabled() and 1 <= x.shape[0] <= f32_kernel_max_rows() and x.is_contiguous()
            and weight.is_contiguous())


@functools.cache
def f32_kernel_max_rows() -> int:
    """The most rows ``f32_linear`` takes with this build (F32_KERNEL_MAX_ROWS by its vector
    width); ask only where ``F32_KERNELS.enabled()``."""
    return F32_KERNEL_MAX_ROWS[F32_KERNELS.module().f32_linear_lanes()]


def f32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors of few rows (kernels/cpu_linear.cpp)."""
    return F32_KERNELS.module().f32_linear(x, weight, bias)


class KernelUnavailableError(cpu_build.KernelUnavailableError):
    """Kept for callers that catch it here: the kernels could not be built."""


def extension():
    """The compiled kernels (built once per machine, then loaded from the cache)."""
    try:
        return F32_KERNELS.module()
    except cpu_build.KernelUnavailableError as exc:
        raise KernelUnavailableError(
            f"reduced-precision CPU weights need {exc}. Use the default float32 weights instead.") from exc


def _grid(groups: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, lo: int, hi: int):
    """(q, largest |error| per group) of ``groups`` on the grid q * scale + offset."""
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))[..., None]
    q = torch.round((groups - offsets[..., None]) / safe).clamp_(lo, hi)
    err = (q * scales[..., None] + offsets[..., None] - groups).abs().amax(dim=-1)
    return q, err


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 q [N, K], float32 scales and offsets [N, K / 32]) for a float [N, K] weight."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int8 weights need in_features divisible by {GROUP}, got {k}")
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    zero = torch.zeros(n, k // GROUP)
    sym_scale = groups.abs().amax(dim=-1) / 127.0
    q_sym, err_sym = _grid(groups, sym_scale, zero, -127, 127)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    aff_scale = (hi - lo) / 255.0
    aff_offset = lo + 128.0 * aff_scale
    q_aff, err_aff = _grid(groups, aff_scale, aff_offset, -128, 127)
    affine = err_aff < err_sym
    q = torch.where(affine[..., None], q_aff, q_sym).to(torch.int8)
    scales = torch.where(affine, aff_scale, sym_scale)
    offsets = torch.where(affine, aff_offset, zero)
    return q.reshape(n, k).contiguous(), scales.contiguous(), offsets.contiguous()


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The float32 weight an int8 weight stands for (exactly what the kernels use:
    a multiply, then an add)."""
    n, k = q.shape
    g = q.reshape(n, k // GROUP, GROUP).float() * scales[..., None]
    return (g + offsets[..., None]).reshape(n, k)


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
    """An int8 weight with grouped scales and offsets; written once by ``from_float``."""

    q: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # float32 [N, K / 32]
    offsets: torch.Tensor  # float32 [N, K / 32]; 0 for symmetric groups

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "Int8Weight":
        return cls(*quantize_int8(weight))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * (self.scales.numel() + self.offsets.numel())

    def dequantize(self) -> torch.Tensor:
        return dequantize_int8(self.q, self.scales, self.offsets)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[0] <= INT8_KERNEL_MAX_ROWS:
            return extension().int8_linear(x, self.q, self.scales, self.offsets, bias)
        w = _Scratch.get(self.shape)
        extension().int8_dequantize(self.q, self.scales, self.offsets, w)
        return F.linear(x, w, bias)


def onednn_packing() -> bool:
    """Whether this torch has oneDNN's packed linear (private ops: F.linear if not)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


@functools.cache  # once a process
def onednn_bf16() -> bool:
    """Whether oneDNN multiplies bfloat16 natively here (AVX512-BF16 / AMX): what the
    bfloat16 format's oneDNN path needs."""
    return onednn_packing() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True, eq=False)
class BF16Weight:
    """A bfloat16 weight; written once by ``from_float``. One row (batch-1 decode) is
    computed in float32 by the kernel; two rows and more, where this CPU multiplies
    bfloat16 natively, by oneDNN on a packed copy with the input rounded to bfloat16
    (float32 sums), else in float32 (the kernel up to 12 rows, F.linear beyond)."""

    w: torch.Tensor  # bfloat16 [N, K]
    packed: torch.Tensor | None = None  # oneDNN's layout of w, for BF16_ONEDNN_MIN_ROWS rows and more

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "BF16Weight":
        w = weight.detach().to(torch.bfloat16).contiguous()
        packed = None
        if onednn_bf16():
            packed = torch.ops.mkldnn._reorder_linear_weight(w, ONEDNN_BATCH_HINT)
        return cls(w, packed)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def dequantize(self) -> torch.Tensor:
        return self.w.float()

    def multiplies_bf16(self, rows: int) -> bool:
        """Whether ``rows`` rows go through oneDNN in bf16 (and may come in as bf16)."""
        return self.packed is not None and rows >= BF16_ONEDNN_MIN_ROWS

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x`` float32, or bfloat16 where ``multiplies_bf16`` (then so is the answer:
        oneDNN's own output, no widening pass; the bias, if any, added in float32 before
        the rounding)."""
        x = x.contiguous()
        rows = x.shape[0]
        if self.multiplies_bf16(rows):
            bf16_in = x.dtype == torch.bfloat16
            out = torch.ops.mkldnn._linear_pointwise(x if bf16_in else x.to(torch.bfloat16), self.packed,
                                                     None, "none", [None], "")
            if bias is None:
                return out if bf16_in else out.float()
            out = out.float().add_(bias)
            return out.to(torch.bfloat16) if bf16_in else out
        if rows <= BF16_KERNEL_MAX_ROWS:
            return extension().bf16_linear(x, self.w, bias)
        w = _Scratch.get(self.shape)
        w.copy_(self.w)  # bf16 -> float32 widening is exact
        return F.linear(x, w, bias)


BLOCK_GROUPS = 16  # groups per interleaved block of the w8a8 layout


def w8a8_layout(q: torch.Tensor) -> torch.Tensor:
    """int8 q [N, K] as w8a8_linear reads it: uint8 q + 128, each run of 16 groups (512
    weights) interleaved in 4-byte chunks (kernels/cpu_linear.cpp), the rest in order."""
    n, k = q.shape
    blocked = k // (GROUP * BLOCK_GROUPS) * GROUP * BLOCK_GROUPS
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    blocks = u[:, :blocked].reshape(n, -1, BLOCK_GROUPS, GROUP // 4, 4).transpose(2, 3).reshape(n, blocked)
    return torch.cat([blocks, u[:, blocked:]], dim=1).contiguous()


_VNNI: bool | None = None  # whether this CPU runs the w8a8 kernels; asked once


def has_vnni() -> bool:
    """AVX512-VNNI (with BW and VL) on this CPU: what w8a8 weights need."""
    global _VNNI
    if _VNNI is None:
        _VNNI = bool(extension().cpu_has_vnni())
    return _VNNI


@dataclass(frozen=True, eq=False)
class W8A8Weight:
    """An int8 weight whose few-rows linear also quantizes x to int8 per group of 32 and
    multiplies with VNNI integer dot products (llama.cpp's Q8 activations); written once
    by ``from_float``, which gives the plain int8 format (float32 activations) on a CPU
    without AVX512-VNNI. Many rows (prefill) take the int8 format's float32 path."""

    w: torch.Tensor  # uint8 [N, K], w8a8_layout of the int8 q
    scales: torch.Tensor  # float32 [N, K / 32]
    offsets: torch.Tensor  # float32 [N, K / 32]

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> "W8A8Weight | Int8Weight":
        q, scales, offsets = quantize_int8(weight)
        if not has_vnni():
            _warn_no_vnni()
            return Int8Weight(q, scales, offsets)
        return cls(w8a8_layout(q), scales, offsets)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.w.shape)

    @property
    def nbytes(self) -> int:
        return self.w.numel() + 4 * (self.scales.numel() + self.offsets.numel())

    def dequantize(self) -> torch.Tensor:
        out = torch.empty(self.shape)
        extension().w8a8_dequantize(self.w, self.scales, self.offsets, out)
        return out

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x.contiguous()
        if x.shape[0] <= INT8_KERNEL_MAX_ROWS:
            return extension().w8a8_linear(x, self.w, self.scales, self.offsets, bias)
        w = _Scratch.get(self.shape)
        extension().w8a8_dequantize(self.w, self.scales, self.offsets, w)
        return F.linear(x, w, bias)


@functools.cache  # once a process
def _warn_no_vnni() -> None:
    logger.warning("quantization='w8a8' needs AVX512-VNNI, which this CPU lacks: "
                   "using the int8 format (float32 activations) instead")


WEIGHT_FORMATS = {"int8": Int8Weight, "w8a8": W8A8Weight, "bfloat16": BF16Weight}

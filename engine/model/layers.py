"""Building blocks shared by the model families: RMSNorm, rotary embedding, activations.

Numerics deliberately follow transformers' reference modules (same op order, same
fp32 upcasts) so our logits match theirs to ~1e-5 in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine import envs
from kernels import cpu_fused, cpu_mkl
from kernels.cpu_linear import ONEDNN_BATCH_HINT, BF16Weight, f32_kernel_takes, f32_linear, onednn_packing

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Activation function by its transformers config name."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}"
        ) from None


class GatedActivation:
    """``act(gate) * up`` over a fused gate/up projection's output [T, 2I] (gate first);
    SiLU on a float32 CPU in one pass (kernels/cpu_fused.cpp, bitwise the same)."""

    def __init__(self, name: str) -> None:
        self.act = activation(name)
        self.silu = self.act is F.silu

    def __call__(self, gate_up: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``out_dtype``: bfloat16 for a bf16 GEMM's input (Linear.input_dtype); a bf16
        ``gate_up`` is computed in float32 on the fused path."""
        if self.silu and gate_up.dim() == 2 and gate_up.stride(1) == 1 and cpu_fused.applies_bf16(gate_up):
            return cpu_fused.silu_mul(gate_up, out_dtype)
        gate, up = gate_up.float().chunk(2, dim=-1)
        return (self.act(gate) * up).to(out_dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 then cast back (as Llama does)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        if x.dim() == 2 and x.stride(1) == 1 and cpu_fused.applies(x, self.weight):
            return cpu_fused.add_rms_norm(None, x, self.weight, self.eps)  # one pass (kernels/cpu_fused.cpp)
        if x.dtype == torch.float32 and x.device.type == "cpu":
            # one dispatch instead of seven; on the CPU in float32 torch's rms_norm runs
            # the same ops in the same order (bitwise equal: tests/model_fast)
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``residual += x`` in place, then the norm of the sum (one pass on the CPU) as
        ``out_dtype`` (bfloat16 for a bf16 GEMM's input; ``x`` may be one's bf16 output)."""
        if (x.dim() == 2 and x.stride(1) == 1 and residual.stride(1) == 1
                and cpu_fused.applies_bf16(x) and cpu_fused.applies(residual, self.weight)):
            return cpu_fused.add_rms_norm(x, residual, self.weight, self.eps, out_dtype)
        residual.add_(x)
        return self(residual).to(out_dtype)


def rope_settings(config: Any) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict) from a transformers config, old or new style.

    transformers 5 folds theta and scaling into `config.rope_parameters`; 4.x kept
    `rope_theta` and `rope_scaling` separately.
    """
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"]), dict(params)
    theta = float(getattr(config, "rope_theta", 10000.0))
    return theta, dict(getattr(config, "rope_scaling", None) or {})


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] for default, linear or Llama-3 scaled RoPE."""
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}"
        )
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, and the
    # band between is interpolated smoothly.
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotates q/k by absolute token position (half-split "rotate_half" layout)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any]) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables [T, head_dim] for int positions [T]."""
        freqs = positions[:, None].float() * self.inv_freq[None, :].float()  # [T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> "RopeTables":
        """The step's tables, shaped to broadcast over heads, built once for all layers."""
        cos, sin = self.cos_sin(positions, dtype)
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2), exactly (negation is exact)
        signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        return RopeTables(cos[:, None, :], signed[:, None, :], half, cos, signed)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd] rotated by cos/sin [T, hd] (the transformers formula)."""
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]


@dataclass(frozen=True, slots=True)
class RopeTables:
    """cos and sign-folded sin [T, 1, head_dim] of one step; written by RotaryEmbedding.tables.
    ``cos_rows`` / ``signed_sin_rows`` are the same tables as [T, head_dim] (the fused op's
    inputs), kept so that each layer's call does not slice them again."""

    cos: torch.Tensor
    signed_sin: torch.Tensor
    half: int
    cos_rows: torch.Tensor
    signed_sin_rows: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``RotaryEmbedding.apply(x, cos, sin)``, bitwise, in four ops instead of seven
        (one on a float32 CPU: kernels/cpu_fused.cpp); ``x`` [T, heads, hd] may be a
        strided view (q and k heads of the fused QKV at once)."""
        if x.stride(2) == 1 and x.stride(1) == x.shape[2] and cpu_fused.applies(x, self.cos):
            return cpu_fused.rope(x, self.cos_rows, self.signed_sin_rows)
        swapped = torch.cat((x[..., self.half:], x[..., :self.half]), dim=-1)
        return x * self.cos + swapped * self.signed_sin


# Float32 GEMMs on the CPU run through a weight packed once into a blocked layout:
# oneDNN's by default (torch.ops.mkldnn, laid out for a batch of 16 rows; it multiplies
# any row count), MKL's (kernels/cpu_mkl.py) where KVSCOPE_CPU_MKL_PACKED=1 asks for it.
# Every linear weight of SmolLM2 once (30 layers: the weights stream from memory), 2
# threads, CPU ms, 2026-12-06 (bench/RESULTS.md, issue 33), oneDNN / MKL packed / F.linear:
# 1 row 40 / 30 / 38, 4 rows 33 / 81 / 81, 16 rows 51 / 125 / 128, 64 rows 152 / 240 / 211,
# 512 rows 1034 / 1225 / 1288. (In 2026-12-02's runs MKL's had been ahead at 16-64 rows;
# this box's torch now carries a newer oneDNN.) At one row F.linear's matrix-vector
# product ran on one thread: a batch-1 decode step took 0.63-0.66x the wall time through
# oneDNN's weights (both threads stream them), for 1.2-1.3x the CPU time. MKL's packing
# serves only 4-64 rows, where it was measured ahead of F.linear; oneDNN's serves every
# step, a 4096-token prefill included. The packed copy doubles the weights' memory.
# Up to kernels.cpu_linear.F32_KERNEL_MAX_ROWS rows (decode steps) its C++ kernel
# multiplies the plain weight instead, faster there (figures in kernels/cpu_linear.cpp).
ONEDNN_ROWS = (1, 4096)
MKL_ROWS = (4, 64)


def packed_rows(mkl: bool) -> tuple[int, int]:
    """The row counts (inclusive) a weight packed for MKL (else oneDNN) multiplies."""
    return MKL_ROWS if mkl else ONEDNN_ROWS


class PackedWeightCache:
    """A packed copy of one CPU float32 weight (oneDNN's layout, or MKL's where asked),
    rebuilt if the weight changes.

    Writer: only ``linear`` (lazily, on the first float32 CPU call). Staleness is caught
    by the weight's storage pointer and version counter (in-place loads bump it).
    """

    __slots__ = ("packed", "mkl", "ptr", "version", "failed")

    def __init__(self) -> None:
        self.packed: torch.Tensor | None = None
        self.mkl = False  # packed for MKL (kernels.cpu_mkl), else for oneDNN
        self.ptr = 0
        self.version = -1
        self.failed = False

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``F.linear(x, weight, bias)``, through the packed weight when that is faster."""
        if (x.dim() != 2 or x.device.type != "cpu" or x.dtype != torch.float32
                or weight.dtype != torch.float32 or self.failed):
            return F.linear(x, weight, bias)
        lo, hi = packed_rows(self.mkl if self.packed is not None else cpu_mkl.usable())
        if not lo <= x.shape[0] <= hi:  # F.linear's own path is as fast: no packed copy for it
            return F.linear(x, weight, bias)
        packed = self._get(weight)
        if packed is None:
            return F.linear(x, weight, bias)
        if not self.mkl and f32_kernel_takes(x, weight):  # few rows: the kernel, on the plain weight
            return f32_linear(x, weight, bias)
        if self.mkl:
            return cpu_mkl.linear(x, packed, weight.shape[0], bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")

    def prepack(self, weight: torch.Tensor) -> None:
        """Pack ``weight`` now, at load, as vLLM does, rather than in the first request's
        forward (~1.2 s for SmolLM2 on 2 threads, all of it on that request's TTFT)."""
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and not self.failed:
            self._get(weight)

    def _get(self, weight: torch.Tensor) -> torch.Tensor | None:
        try:
            version = weight._version
        except RuntimeError:  # an inference tensor: no version counter, pointer only
            version = -2
        if self.packed is None or self.ptr != weight.data_ptr() or self.version != version:
            self.packed = None  # the stale copy goes before the new one is made
            if not envs.PACKED_LINEAR.get():
                self.failed = True
                return None
            try:  # oneDNN's is a private op: if this torch lacks or changed it, use F.linear
                if cpu_mkl.usable():
                    self.packed, self.mkl = cpu_mkl.pack(weight), True
                elif onednn_packing():
                    self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ONEDNN_BATCH_HINT)
                    self.mkl = False
            except Exception:  # noqa: BLE001 (packed stays None: the reset above)
                pass
            if self.packed is None:
                self.failed = True
                return None
            self.ptr, self.version = weight.data_ptr(), version
        return self.packed


def prepack_linears(model: nn.Module) -> int:
    """Pack every float32 CPU ``Linear``'s weight now (``PackedWeightCache.prepack``), and
    the lm_head's where the model multiplies it through a cache of its own
    (``logits_packed`` / ``logits_weight``, engine/model/llama.py: its packing took ~0.26 s
    of the first request's TTFT); how many are packed."""
    caches = [(m.packed, m.weight) for m in model.modules() if isinstance(m, Linear) and m.reduced is None]
    if getattr(model, "logits_packed", None) is not None and getattr(model, "logits_reduced", None) is None:
        caches.append((model.logits_packed, model.logits_weight))
    for cache, weight in caches:
        cache.prepack(weight)
    return sum(cache.packed is not None for cache, _ in caches)


class Linear(nn.Module):
    """y = x W^T + b with uninitialised weight slots (filled by `load_weights`).

    Fused projections (QKV, gate/up) are simply a Linear whose weight is several HF
    weights concatenated along the output dim; one GEMM instead of two or three.
    Small batches on the CPU go through a packed copy of the weight (see above).
    After ``reduce_precision`` the weight lives as int8 or bfloat16 instead
    (kernels/cpu_linear.py) and the float32 parameter is dropped.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        )
        self.packed = PackedWeightCache()
        self.reduced = None  # kernels.cpu_linear.Int8Weight / BF16Weight; written by reduce_precision

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.reduced is not None:
            return self.reduced.linear(x, self.bias)
        return self.packed.linear(x, self.weight, self.bias)

    def input_dtype(self, rows: int) -> torch.dtype:
        """bfloat16 where this linear multiplies ``rows`` rows in bf16 (a bf16 weight on
        oneDNN: its input is rounded anyway, so the op before may write it as bf16, and
        it answers in bf16), else float32."""
        r = self.reduced
        return torch.bfloat16 if type(r) is BF16Weight and r.multiplies_bf16(rows) else torch.float32

    def reduce_precision(self, fmt: str) -> None:
        """Store the weight as ``fmt`` (one of REDUCED_FORMATS; kernels/cpu_linear.py)."""
        self.reduced = reduced_weight(self.weight, fmt)
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)  # free the float32 copy

    @property
    def num_weights(self) -> int:
        return self.in_features * self.out_features

    @property
    def weight_bytes(self) -> int:
        """Bytes of weight one forward reads (the packed copy, if used, is the same size)."""
        if self.reduced is not None:
            return self.reduced.nbytes
        return self.weight.numel() * self.weight.element_size()


REDUCED_FORMATS = ("int8", "w8a8", "bfloat16")


def reduced_weight(weight: torch.Tensor, fmt: str):
    """``weight`` [N, K] as an int8 / w8a8 / bfloat16 weight of kernels.cpu_linear (CPU only)."""
    from kernels.cpu_linear import WEIGHT_FORMATS

    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {REDUCED_FORMATS}")
    if weight.device.type != "cpu":
        raise ValueError("reduced-precision weights are a CPU feature; on CUDA use dtype bfloat16")
    return WEIGHT_FORMATS[fmt].from_float(weight)


class LayerNorm(nn.Module):
    """LayerNorm with optional affine slots (OPT can disable them)."""

    def __init__(self, hidden_size: int, affine: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = (
            nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine else None
        )
        self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)

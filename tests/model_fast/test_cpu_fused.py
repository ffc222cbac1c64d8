"""The fused CPU layer ops (kernels/cpu_fused.cpp) against the torch ops they replace:
SiLU-times-up and rotary embedding bitwise, residual add + RMSNorm to float32 rounding;
and the layers that use them give the torch path's results with the ops turned off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.layers import GatedActivation, RMSNorm, RotaryEmbedding
from kernels import cpu_fused


@pytest.fixture(scope="module", autouse=True)
def _built(cpu_compiler):
    cpu_fused.extension()


@pytest.fixture
def torch_ops(monkeypatch):
    """Turns the fused ops off for the test (as KVSCOPE_CPU_FUSED=0 does at start)."""
    def off():
        monkeypatch.setattr(cpu_fused.KERNELS, "on", False)
    return off


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# 1536: SmolLM2 (whole 32-wide chunks); 40 and 7: a scalar tail as in ATen's loops
@pytest.mark.parametrize("width", [1536, 128, 40, 7])
def test_silu_mul_is_bitwise_torch(width):
    gate_up = torch.randn(6, 2 * width, generator=_gen(width)) * 4
    want = F.silu(gate_up[:, :width]) * gate_up[:, width:]
    assert torch.equal(cpu_fused.silu_mul(gate_up), want)
    assert torch.equal(GatedActivation("silu")(gate_up), want)


@pytest.mark.parametrize("head_dim", [64, 16, 6])
def test_rope_is_bitwise_the_torch_formula_on_strided_heads(head_dim, torch_ops):
    rotary = RotaryEmbedding(head_dim, 10000.0, {})
    positions = torch.tensor([0, 3, 17, 200, 511])
    tables = rotary.tables(positions, torch.float32)
    x = torch.randn(5, 12 + 3, head_dim, generator=_gen(head_dim))  # q and k heads, then v
    view = x[:, :12]  # rows strided, heads contiguous: the fused QKV output's q/k part
    fused = tables.apply(view)
    assert fused.is_contiguous()
    cos, sin = rotary.cos_sin(positions, torch.float32)
    assert torch.equal(fused, RotaryEmbedding.apply(view, cos, sin))
    torch_ops()
    assert torch.equal(tables.apply(view), fused)


@pytest.mark.parametrize("width", [576, 64, 50])
def test_add_rms_norm_matches_torch_and_updates_the_residual(width, torch_ops):
    norm = RMSNorm(width, 1e-5)
    norm.weight.copy_(torch.randn(width, generator=_gen(1)))
    x = torch.randn(9, width, generator=_gen(2))
    residual = torch.randn(9, width, generator=_gen(3))
    total = residual + x
    want = torch.rms_norm(total, (width,), norm.weight, 1e-5)
    got = norm.add_and_norm(x, residual)
    assert torch.equal(residual, total)  # the add is the same single rounding as torch's
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm(total), want, rtol=1e-6, atol=1e-6)
    torch_ops()
    residual2 = (total - x).clone()  # the old residual again (up to the add's rounding)
    torch.testing.assert_close(norm.add_and_norm(x, residual2), want, rtol=1e-6, atol=1e-6)


def test_fused_ops_refuse_bad_shapes():
    with pytest.raises(RuntimeError, match="out must be"):
        cpu_fused.extension().silu_mul(torch.randn(2, 8), torch.empty(2, 3))
    with pytest.raises(RuntimeError, match="contiguous rows"):
        cpu_fused.extension().add_rms_norm(None, torch.randn(8, 4).t(), torch.ones(8), 1e-5, torch.empty(4, 8))
    with pytest.raises(RuntimeError, match="head_dim"):
        cpu_fused.extension().rope(torch.randn(2, 3, 8), torch.randn(2, 4), torch.randn(2, 4), torch.empty(2, 3, 8))


def test_the_split_into_tasks_changes_no_result():
    ext = cpu_fused.extension()
    default = ext.get_grain_elems()
    assert default == 1 << 18  # a decode batch of up to 64 SmolLM2 rows stays on one thread
    gate_up = torch.randn(96, 2 * 1536, generator=_gen(3))
    x, res, w = (torch.randn(96, 576, generator=_gen(s)) for s in (4, 5, 6))
    outs = []
    try:
        for grain in (1, 1 << 14, default):
            ext.set_grain_elems(grain)
            r = res.clone()
            outs.append((cpu_fused.silu_mul(gate_up), cpu_fused.add_rms_norm(x, r, w[0], 1e-5), r))
    finally:
        ext.set_grain_elems(default)
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))
    with pytest.raises(RuntimeError, match="at least one element"):
        ext.set_grain_elems(0)


# ---- bfloat16 inputs and outputs (the bf16 weights' GEMMs: kernels/cpu_linear.py) ----------

BF16 = torch.bfloat16


@pytest.mark.parametrize("width", [1536, 40, 7])  # 40, 7: the scalar tail's conversions
@pytest.mark.parametrize("in_dtype,out_dtype", [(BF16, BF16), (BF16, torch.float32), (torch.float32, BF16)])
def test_silu_mul_in_bf16_is_the_float32_op_widened_and_rounded(width, in_dtype, out_dtype):
    gate_up = (torch.randn(5, 2 * width, generator=_gen(width)) * 4).to(in_dtype)
    want = cpu_fused.silu_mul(gate_up.float()).to(out_dtype)  # float32 arithmetic, then nearest even
    got = cpu_fused.silu_mul(gate_up, out_dtype)
    assert got.dtype == out_dtype and torch.equal(got, want)
    assert torch.equal(GatedActivation("silu")(gate_up, out_dtype), want)


@pytest.mark.parametrize("width", [576, 50])
@pytest.mark.parametrize("x_dtype,out_dtype", [(BF16, BF16), (BF16, torch.float32), (torch.float32, BF16), (None, BF16)])
def test_add_rms_norm_in_bf16_is_the_float32_op_widened_and_rounded(width, x_dtype, out_dtype, torch_ops):
    w = torch.randn(width, generator=_gen(3))
    x = None if x_dtype is None else (torch.randn(7, width, generator=_gen(4)) * 2).to(x_dtype)
    r0 = torch.randn(7, width, generator=_gen(5))
    r_want, r_got = r0.clone(), r0.clone()
    want = cpu_fused.add_rms_norm(None if x is None else x.float(), r_want, w, 1e-5).to(out_dtype)
    got = cpu_fused.add_rms_norm(x, r_got, w, 1e-5, out_dtype)
    assert got.dtype == out_dtype and torch.equal(got, want)
    assert torch.equal(r_got, r_want)  # the residual stays float32: r + widened x
    if x is not None:  # the layer, fused and with the torch ops (to float32 rounding there)
        norm = RMSNorm(width, 1e-5)
        norm.weight.copy_(w)
        r1 = r0.clone()
        assert torch.equal(norm.add_and_norm(x, r1, out_dtype), want)
        torch_ops()
        r2 = r0.clone()
        torch.testing.assert_close(norm.add_and_norm(x, r2, out_dtype).float(), want.float(),
                                   rtol=2 ** -7, atol=1e-6)  # one bf16 ulp at most
        assert torch.equal(r2, r_want)


def test_bf16_outputs_round_to_nearest_even_and_keep_nan():
    """The vector conversion is torch's: ties to even, NaN stays NaN (a NaN whose mantissa
    is all ones must not carry into the sign bit: the arithmetic keeps its payload)."""
    width = 48  # three full 16-wide vectors, no tail
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7FFFFFFF, 0x7F7FFFFF, 0xFF800000],
                        dtype=torch.int64).to(torch.int32)
    vals = bits.view(torch.float32)  # 1+2^-8 (a tie: down), 1+3*2^-8 (a tie: up), below a tie, NaN, max, -inf
    up = torch.ones(1, width)
    up[0, : len(vals)] = vals
    # silu(256) is 256 exactly (exp(-256) is 0 in float32), so each product is up * 2^8,
    # exact in float32: the only rounding is the bf16 store's
    gate_up = torch.cat([torch.full((1, width), 256.0), up], dim=1)
    got = cpu_fused.silu_mul(gate_up, BF16)
    want = (up * 256).to(BF16)
    assert torch.equal(got[0, :3].view(torch.int16), want[0, :3].view(torch.int16))
    assert got[0, 0] == 256 and got[0, 1] == 256 * (1 + 2 ** -6)  # the ties went to even
    assert torch.isnan(got[0, 3]) and got[0, 4] == float("inf") and got[0, 5] == float("-inf")
    assert torch.isinf(want[0, 4])  # max float * 256 overflows in float32 already

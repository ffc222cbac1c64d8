"""Reduced-precision CPU weights (kernels/cpu_linear.py): int8 with grouped scales and
bfloat16, float32 compute. The C++ kernels are built on first use."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_linear as C
from engine.model.layers import Linear


@pytest.fixture(scope="module")
def ext(cpu_compiler):
    return C.extension()


def _weight(n, k, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_int8_roundtrip_is_exact_for_q8_0_weights():
    # llama.cpp's Q8_0: w = d * q per 32 weights, |q| <= 127 and one |q| == 127 per group
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (8, 4, 32), generator=gen, dtype=torch.int32)
    q[:, :, 0] = 127
    d = torch.rand(8, 4, 1, generator=gen) * 0.01
    w = (q.float() * d).reshape(8, 128)
    qi, scales, offsets = C.quantize_int8(w)
    assert torch.equal(qi.reshape(8, 4, 32).int(), q) and not offsets.any()
    torch.testing.assert_close(C.dequantize_int8(qi, scales, offsets), w, rtol=2e-7, atol=0)


def test_int8_roundtrip_is_near_exact_for_q4_1_weights():
    # llama.cpp's Q4_1: w = m + d * q per 32 weights, q in 0..15 with both ends used
    gen = torch.Generator().manual_seed(2)
    q = torch.randint(0, 16, (8, 4, 32), generator=gen)
    q[:, :, 0], q[:, :, 1] = 0, 15
    d = torch.rand(8, 4, 1, generator=gen) * 0.01
    m = -torch.rand(8, 4, 1, generator=gen) * 0.05
    w = (m + d * q.float()).reshape(8, 128)
    qi, scales, offsets = C.quantize_int8(w)
    assert offsets.all()  # every group took the affine grid
    err = (C.dequantize_int8(qi, scales, offsets) - w).abs().reshape(8, 4, 32)
    # float rounding only (a few ulp of the group's largest weight), not half a step
    ulp = torch.finfo(torch.float32).eps * w.reshape(8, 4, 32).abs().amax(-1, keepdim=True)
    assert bool((err <= 8 * ulp).all())


def test_int8_error_is_at_most_half_a_step():
    w = _weight(16, 96)
    q, scales, offsets = C.quantize_int8(w)
    assert q.dtype == torch.int8 and scales.shape == offsets.shape == (16, 3)
    err = (C.dequantize_int8(q, scales, offsets) - w).abs().reshape(16, 3, 32)
    assert bool((err <= scales[..., None] / 2 * (1 + 1e-5)).all())
    assert torch.equal(C.quantize_int8(torch.zeros(2, 32))[0], torch.zeros(2, 32, dtype=torch.int8))
    with pytest.raises(ValueError, match="divisible by 32"):
        C.quantize_int8(torch.zeros(2, 40))


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, C.INT8_KERNEL_MAX_ROWS, C.INT8_KERNEL_MAX_ROWS + 1, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_matches_its_dequantized_weight(ext, rows, bias):
    w8 = C.Int8Weight.from_float(_weight(200, 160))
    b = torch.randn(200) if bias else None
    x = torch.randn(rows, 160)
    torch.testing.assert_close(w8.linear(x, b), F.linear(x, w8.dequantize(), b), rtol=1e-5, atol=1e-5)


def _onednn_rows(wb: C.BF16Weight, x: torch.Tensor) -> bool:
    return wb.packed is not None and x.shape[0] >= C.BF16_ONEDNN_MIN_ROWS


def _bf16_reference(wb: C.BF16Weight, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """What ``wb.linear`` computes: float32 products of the widened weight; where oneDNN's
    bf16 path takes these rows, of the input rounded to bfloat16, the sum rounded to
    bfloat16 (oneDNN's output) before the float32 bias."""
    onednn = _onednn_rows(wb, x)
    out = F.linear(x.bfloat16().double() if onednn else x.double(), wb.w.double())
    out = out.float().bfloat16().float() if onednn else out.float()
    return out if b is None else out + b


def _assert_bf16_close(wb: C.BF16Weight, x: torch.Tensor, got: torch.Tensor, b: torch.Tensor | None) -> None:
    """``got`` is ``_bf16_reference``'s answer. oneDNN's float32 sum and float64's may round
    to neighbouring bfloat16 values, one unit in the last place: 2^-7 of the sum at most
    (at the bottom of a binade; so it is compared before the bias)."""
    want = _bf16_reference(wb, x, None)
    if b is not None:
        got = got - b
    tol = dict(rtol=2 ** -7, atol=1e-5) if _onednn_rows(wb, x) else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("rows", [1, 2, 4, 9, C.BF16_KERNEL_MAX_ROWS + 3, 300])
@pytest.mark.parametrize("k", [64, 80, 72])  # 80, 72: the kernel's 16-column step and scalar tail
@pytest.mark.parametrize("onednn", [True, False])
def test_bf16_linear_matches_its_widened_weight(ext, rows, k, onednn):
    wb = C.BF16Weight.from_float(_weight(50, k, seed=2))
    if onednn and wb.packed is None:
        pytest.skip("this CPU or torch has no native bf16 oneDNN matmul")
    if not onednn:
        wb = C.BF16Weight(wb.w)  # the float32 paths: the kernel, then F.linear on the widened weight
    g = torch.Generator().manual_seed(rows * 100 + k)
    x = torch.randn(rows, k, generator=g)
    b = torch.randn(50, generator=g)
    _assert_bf16_close(wb, x, wb.linear(x, b), b)
    assert wb.nbytes == 50 * k * 2


def test_bf16_linear_rounds_only_on_the_onednn_path(ext):
    """One row is float32 products; two rows go through oneDNN in bf16: the same row gives
    the float32 answer alone and a rounded one beside another row."""
    wb = C.BF16Weight.from_float(_weight(64, 128, seed=4))
    if wb.packed is None:
        pytest.skip("this CPU or torch has no native bf16 oneDNN matmul")
    x = torch.randn(2, 128) * 3
    exact = F.linear(x.double(), wb.w.double()).float()
    torch.testing.assert_close(wb.linear(x[:1], None), exact[:1], rtol=1e-5, atol=1e-5)
    two = wb.linear(x, None)
    _assert_bf16_close(wb, x, two, None)
    assert (two - exact).abs().max() > 1e-3  # the rounding is visible at this scale


def test_kernel_rejects_bad_inputs(ext):
    w8 = C.Int8Weight.from_float(_weight(8, 64))
    with pytest.raises(RuntimeError, match="features"):
        ext.int8_linear(torch.randn(2, 32), w8.q, w8.scales, w8.offsets, None)
    with pytest.raises(RuntimeError, match="float32"):
        ext.int8_linear(torch.randn(2, 64, dtype=torch.float64), w8.q, w8.scales, w8.offsets, None)
    with pytest.raises(RuntimeError, match="offsets"):
        ext.int8_linear(torch.randn(2, 64), w8.q, w8.scales, w8.scales[:1], None)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 17, 64])
@pytest.mark.parametrize("n,k", [(1, 16), (2, 8), (3, 17), (4, 576), (5, 9), (7, 31), (13, 64), (961, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_f32_linear_is_a_float32_product(ext, rows, n, k, bias):
    """The few-rows float32 kernel against a float64 product: every run length of weight
    rows (N mod 4 with AVX-512, N mod 3 with AVX2), every pass of input rows (M mod 4), K
    not a multiple of the vector (16 or 8 floats: the masked tail), within float32's rounding of sums of K products (F.linear's own error,
    measured beside it, is of the same size)."""
    x, w = torch.randn(rows, k), torch.randn(n, k)
    b = torch.randn(n) if bias else None
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = ext.f32_linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    bound = 4 * torch.finfo(torch.float32).eps * (x.abs().double() @ w.abs().double().T + 1)
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((F.linear(x, w, b).double() - exact).abs() <= bound).all()  # the bound holds torch's own too


def test_f32_linear_rejects_bad_inputs(ext):
    w = torch.randn(8, 64)
    with pytest.raises(RuntimeError, match="features"):
        ext.f32_linear(torch.randn(2, 32), w, None)
    with pytest.raises(RuntimeError, match="float32"):
        ext.f32_linear(torch.randn(2, 64), w.double(), None)
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.f32_linear(torch.randn(2, 64), torch.randn(64, 8).T, None)
    with pytest.raises(RuntimeError, match="bias"):
        ext.f32_linear(torch.randn(2, 64), w, torch.randn(7))


def test_float32_linears_of_few_rows_take_the_kernel_and_more_rows_onednn(ext, monkeypatch):
    """PackedWeightCache routes 1..f32_kernel_max_rows() rows to f32_linear (the plain
    weight) and more to oneDNN's packed copy; KVSCOPE_CPU_F32_LINEAR=0's switch
    (F32_KERNELS.on) sends few rows back to oneDNN."""
    from engine.model import layers

    if not layers.onednn_packing():
        pytest.skip("no oneDNN packing in this torch")
    calls = []
    real = layers.f32_linear
    monkeypatch.setattr(layers, "f32_linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    lin = Linear(64, 48, False)
    with torch.no_grad():
        lin.weight.copy_(_weight(48, 64))
    if not C.F32_KERNELS.enabled():
        pytest.skip("f32_linear has no vector path on this CPU (the test below covers that)")
    top = C.f32_kernel_max_rows()
    assert top == C.F32_KERNEL_MAX_ROWS[ext.f32_linear_lanes()]
    for rows in (1, 16, top, top + 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-5, rtol=1e-5)
    assert calls == [1, 16, top]
    monkeypatch.setattr(C.F32_KERNELS, "on", False)
    lin(torch.randn(4, 64))
    assert calls == [1, 16, top]


def test_a_build_without_a_vector_path_leaves_float32_linears_to_onednn(ext, caplog):
    """f32_linear's scalar loop (a build for a CPU with neither AVX-512 nor AVX2) is ~10x
    slower than oneDNN: F32_KERNELS refuses such a build, with a warning, and stays off."""
    from types import SimpleNamespace

    from kernels import cpu_build

    assert ext.f32_linear_lanes() in (0, 8, 16)
    for lanes in (16, 8):
        assert C.F32_KERNELS.refuses(SimpleNamespace(f32_linear_lanes=lambda: lanes)) is None
    scalar = SimpleNamespace(f32_linear_lanes=lambda: 0)
    why = C.F32_KERNELS.refuses(scalar)
    assert "no vector path" in why
    kernels = cpu_build.DefaultPathKernels("cpu_linear.cpp", "KVSCOPE_CPU_F32_LINEAR", "falls back",
                                           refuses=C.F32_KERNELS.refuses)
    kernels.module = lambda: scalar
    with caplog.at_level("WARNING", logger="kernels.cpu_build"):
        assert kernels.enabled() is False
    assert f"falls back: {why}" in caplog.text


@pytest.mark.parametrize("fmt", ["int8", "bfloat16"])
def test_linear_reduce_precision_drops_the_float32_weight(ext, fmt):
    lin = Linear(64, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(_weight(48, 64, seed=3))
        lin.bias.copy_(torch.randn(48))
    x = torch.randn(3, 64)
    before = lin(x)
    lin.reduce_precision(fmt)
    assert lin.weight.numel() == 0 and lin.num_weights == 48 * 64
    assert lin.weight_bytes == (48 * 64 + 2 * 48 * 2 * 4 if fmt == "int8" else 48 * 64 * 2)
    if fmt == "bfloat16":
        _assert_bf16_close(lin.reduced, x, lin(x), lin.bias)
    else:
        torch.testing.assert_close(lin(x), F.linear(x, lin.reduced.dequantize(), lin.bias), rtol=1e-5, atol=1e-5)
    assert (lin(x) - before).abs().max() < 0.05  # a coarse check that it is still the same layer
    with pytest.raises(ValueError, match="unknown weight format"):
        Linear(32, 8, False).reduce_precision("int4")


# ---- w8a8: int8 weights x int8-rounded inputs, VNNI ----------------------------------------

@pytest.fixture(scope="module")
def vnni(ext):
    if not C.has_vnni():
        pytest.skip("this CPU has no AVX512-VNNI: w8a8 gives the int8 format (test_w8a8_without_vnni_is_int8)")
    return ext


def _w8a8(n, k, seed=0):
    w8 = C.Int8Weight.from_float(_weight(n, k, seed))
    return w8, C.W8A8Weight.from_float(_weight(n, k, seed))


# K: no whole block of 16 groups (160), one and a pair left (576: SmolLM2's hidden), whole
# blocks only (1024), blocks and an odd group left (1056), SmolLM2's intermediate (1536)
KS = [32, 160, 576, 1024, 1056, 1536]


@pytest.mark.parametrize("k", KS)
def test_w8a8_layout_holds_the_int8_weight(vnni, k):
    w8, wa = _w8a8(24, k, seed=k)
    assert wa.w.dtype == torch.uint8 and wa.nbytes == w8.nbytes
    assert torch.equal(wa.scales, w8.scales) and torch.equal(wa.offsets, w8.offsets)
    assert torch.equal(wa.dequantize(), w8.dequantize())  # the same multiply and add
    # the layout is a permutation within each row of q + 128
    assert torch.equal(wa.w.sort(dim=1).values, (w8.q.to(torch.int16) + 128).to(torch.uint8).sort(dim=1).values)


def _quantize_reference(x):
    """x rounded per group of 32 as the kernel does it, in torch float32 (d = max |x| / 127,
    xq = round half to even of x * (1 / d))."""
    g = x.reshape(x.shape[0], -1, 32)
    d = g.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
    return torch.round(g * inv[..., None]).to(torch.int8).reshape(x.shape), d


def test_w8a8_input_rounding_is_exactly_the_reference(vnni):
    x = torch.randn(5, 576)
    x[1, 32:64] = 0  # a zero group: d = 0, xq = 0
    x[2, :32] = torch.arange(32) - 16.0  # d = 16 / 127: halves to even at 127 * v / 16
    xq, d = vnni.quantize_activations(x)
    rq, rd = _quantize_reference(x)
    assert torch.equal(xq, rq) and torch.equal(d, rd)
    assert int(xq.abs().max()) == 127 and not xq[1, 32:64].any()


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 16])
def test_w8a8_linear_is_its_quantized_math(vnni, k, rows):
    """Against float64 of the same math: x_hat = d * xq (exactly the kernel's rounding), times
    the dequantized weight. The integer dot products are exact; what is left is float32
    rounding of a few products and a sum over K / 32 groups, bounded as such."""
    w8, wa = _w8a8(40, k, seed=rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k + rows))
    b = torch.randn(40)
    xq, d = vnni.quantize_activations(x)
    xhat = (xq.double().reshape(rows, -1, 32) * d.double()[..., None]).reshape(rows, k)
    w = w8.dequantize().double()
    ref = xhat @ w.T + b.double()
    y = wa.linear(x, b)
    groups = k // 32
    bound = (groups + 16) * torch.finfo(torch.float32).eps * (xhat.abs() @ w.abs().T + b.double().abs())
    assert bool(((y.double() - ref).abs() <= bound).all()), (y.double() - ref).abs().max()
    # and it is not the float32-input result: the rounding of x shows
    assert not torch.allclose(y, w8.linear(x, b), rtol=1e-6, atol=1e-6)


def test_w8a8_many_rows_take_the_float_path(vnni):
    w8, wa = _w8a8(50, 576)
    x = torch.randn(C.INT8_KERNEL_MAX_ROWS + 1, 576)
    torch.testing.assert_close(wa.linear(x, None), F.linear(x, w8.dequantize(), None), rtol=1e-5, atol=1e-5)


def test_w8a8_kernel_rejects_bad_inputs(vnni):
    _, wa = _w8a8(8, 64)
    with pytest.raises(RuntimeError, match="uint8"):
        vnni.w8a8_linear(torch.randn(2, 64), wa.w.view(torch.int8), wa.scales, wa.offsets, None)
    with pytest.raises(RuntimeError, match="features"):
        vnni.w8a8_linear(torch.randn(2, 32), wa.w, wa.scales, wa.offsets, None)
    with pytest.raises(RuntimeError, match="offsets"):
        vnni.w8a8_linear(torch.randn(2, 64), wa.w, wa.scales, wa.offsets[:1], None)


def test_w8a8_without_vnni_is_int8(ext, monkeypatch, caplog):
    monkeypatch.setattr(C, "_VNNI", False)
    C._warn_no_vnni.cache_clear()  # warn again in this test
    with caplog.at_level("WARNING", logger="kernels.cpu_linear"):
        w = C.W8A8Weight.from_float(_weight(30, 96))
        C.W8A8Weight.from_float(_weight(30, 96))
    assert isinstance(w, C.Int8Weight) and caplog.text.count("needs AVX512-VNNI") == 1
    assert torch.equal(w.q, C.Int8Weight.from_float(_weight(30, 96)).q)
    lin = Linear(96, 30, bias=False)
    with torch.no_grad():
        lin.weight.copy_(_weight(30, 96))
    lin.reduce_precision("w8a8")
    assert isinstance(lin.reduced, C.Int8Weight)

"""Small-batch CPU linears through packed weights, MKL's or oneDNN's (engine.model.layers)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import layers
from kernels import cpu_mkl
from engine.model.layers import Linear, PackedWeightCache


def _filled(in_f: int, out_f: int, bias: bool, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = Linear(in_f, out_f, bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_f, in_f, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(out_f, generator=gen))
    return lin


@pytest.mark.parametrize("rows", [1, 5, 16, 64, 65, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(rows, bias):
    lin = _filled(96, 160, bias)
    x = torch.randn(rows, 96)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)


def test_batches_in_the_packed_range_use_the_packed_copy_and_others_do_not():
    if not (layers.onednn_packing() or cpu_mkl.usable()):
        pytest.skip("this torch build packs no weights")
    lo, hi = layers.packed_rows(cpu_mkl.usable())
    lin = _filled(32, 48, True)
    for rows in (lo - 1, hi + 1):
        x = torch.randn(rows, 32)
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
        assert lin.packed.packed is None
    lin(torch.randn(lo, 32))
    assert lin.packed.packed is not None


def test_onednn_packs_by_default_from_one_row_to_a_long_prefill():
    if cpu_mkl.usable() or not layers.onednn_packing():
        pytest.skip("MKL's packing asked for, or no oneDNN packing in this torch")
    assert layers.packed_rows(False) == (1, 4096)
    lin = _filled(32, 48, True)
    x = torch.randn(2048, 32)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)
    assert lin.packed.packed is not None and not lin.packed.mkl


def test_repacks_after_the_weight_changes_in_place():
    lin = _filled(32, 48, False)
    x = torch.randn(layers.packed_rows(cpu_mkl.usable())[0] + 1, 32)
    lin(x)
    first = lin.packed.packed
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight), atol=1e-4, rtol=1e-5)
    assert first is None or lin.packed.packed is not first


def test_other_dtypes_fall_back(monkeypatch):
    cache = PackedWeightCache()
    w = torch.randn(8, 4, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64)
    assert torch.equal(cache.linear(x, w, None), F.linear(x, w))
    assert cache.packed is None


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("KVSCOPE_PACKED_LINEAR", "0")
    lin = _filled(16, 8, False)
    x = torch.randn(layers.packed_rows(cpu_mkl.usable())[0] + 1, 16)
    assert torch.equal(lin(x), F.linear(x, lin.weight))
    assert lin.packed.packed is None


def test_prepack_packs_every_float32_linear_at_load_and_the_results_are_the_same():
    """``prepack_linears`` (the engine core calls it at load on the CPU) packs each weight
    the way the first forward would have, so that forward is no slower and no different."""
    if not (layers.onednn_packing() or cpu_mkl.usable()):
        pytest.skip("this torch build packs no weights")
    model = torch.nn.Sequential(_filled(32, 48, True, seed=1), _filled(48, 16, False, seed=2))
    reduced = _filled(32, 8, False, seed=3)
    reduced.reduced = object()  # a reduced-precision linear has no float32 weight to pack
    model.append(reduced)
    assert layers.prepack_linears(model) == 2
    first = model[0].packed.packed
    assert first is not None and reduced.packed.packed is None
    x = torch.randn(3, 32)
    lazy = _filled(32, 48, True, seed=1)
    assert torch.equal(model[0](x), lazy(x))  # the packed copy, made at load, gives what a lazy one does
    assert model[0].packed.packed is first  # and the forward reused it


@pytest.mark.parametrize("kind", ["llama3-tied", "llama"])
def test_prepack_packs_the_lm_head_too(kind):
    """A llama model's lm_head (tied to the embedding, or its own) goes through
    ``logits_packed``, not a ``Linear``: it is packed at load with the rest, and the first
    logits reuse it."""
    if not (layers.onednn_packing() or cpu_mkl.usable()):
        pytest.skip("this torch build packs no weights")
    from engine.model.loader import load_model
    from tests.tiny_models import tiny_model_dir

    model = load_model(str(tiny_model_dir(kind))).model
    n_linears = sum(isinstance(m, layers.Linear) for m in model.modules())
    assert model.logits_packed.packed is None
    assert layers.prepack_linears(model) == n_linears + 1
    packed = model.logits_packed.packed
    weight = model.logits_weight
    assert packed is not None and (weight is model.embed_tokens) == (kind == "llama3-tied")
    hidden = torch.randn(layers.packed_rows(cpu_mkl.usable())[0], weight.shape[1])
    torch.testing.assert_close(model.compute_logits(hidden), F.linear(hidden, weight))
    assert model.logits_packed.packed is packed

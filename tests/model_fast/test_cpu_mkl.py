"""MKL's packed GEMM (kernels/cpu_mkl.cpp): one pack multiplies any row count as
F.linear does, and the packed linears of the default path use it where it is here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import layers
from engine.model.layers import Linear
from kernels import cpu_mkl


@pytest.fixture
def mkl(cpu_compiler):
    if not cpu_mkl.extension().available():
        pytest.skip("this torch build carries no MKL packed GEMM")
    return cpu_mkl


@pytest.mark.parametrize("shape", [(160, 96), (96, 160), (1000, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_one_pack_multiplies_any_row_count(mkl, shape, bias):
    gen = torch.Generator().manual_seed(1)
    n, k = shape
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    w0, b0 = w.clone(), (b.clone() if bias else None)
    packed = mkl.pack(w)  # laid out for PACK_ROWS rows
    for rows in (1, 3, 4, 7, 16, 33, 64, 65, 128):
        x = torch.randn(rows, k, generator=gen)
        got = mkl.linear(x, packed, n, b)
        assert got.shape == (rows, n)
        torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-4, rtol=1e-5)
    assert torch.equal(w, w0) and (not bias or torch.equal(b, b0))  # inputs untouched


def test_a_non_contiguous_input_is_multiplied_as_it_reads(mkl):
    w = torch.randn(48, 32)
    x = torch.randn(32, 8).t()  # [8, 32], transposed view
    torch.testing.assert_close(mkl.linear(x, mkl.pack(w), 48), F.linear(x, w), atol=1e-4, rtol=1e-5)


def test_bad_arguments_are_errors_not_crashes(mkl):
    with pytest.raises(RuntimeError, match="float32"):
        mkl.pack(torch.randn(4, 4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="bias"):
        mkl.linear(torch.randn(2, 4), mkl.pack(torch.randn(3, 4)), 3, torch.randn(5))


def test_the_packed_linears_use_onednn_by_default_and_mkl_when_asked(mkl, monkeypatch):
    monkeypatch.setattr(cpu_mkl.KERNELS, "on", None)  # decided again, from the environment
    monkeypatch.delenv("KVSCOPE_CPU_MKL_PACKED", raising=False)
    x = torch.randn(layers.MKL_ROWS[0] + 3, 32)  # a row count both packings serve
    other = Linear(32, 48, False)
    with torch.no_grad():
        other.weight.normal_()
    torch.testing.assert_close(other(x), F.linear(x, other.weight), atol=1e-4, rtol=1e-5)
    assert not other.packed.mkl  # oneDNN's packing, or none
    monkeypatch.setattr(cpu_mkl.KERNELS, "on", None)
    monkeypatch.setenv("KVSCOPE_CPU_MKL_PACKED", "1")
    lin = Linear(32, 48, True)
    with torch.no_grad():
        lin.weight.normal_()
        lin.bias.normal_()
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-4, rtol=1e-5)
    assert lin.packed.mkl and lin.packed.packed is not None
    big = torch.randn(layers.MKL_ROWS[1] + 1, 32)  # beyond MKL's rows: F.linear
    assert torch.equal(lin(big), F.linear(big, lin.weight, lin.bias))

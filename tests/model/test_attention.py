"""Attention backends: selection, metadata validation, and the cache helpers."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

from engine.model import (
    AttentionMetadata,
    TorchAttentionBackend,
    TritonAttentionBackend,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    num_blocks_for_budget,
    select_backend,
)


def _meta(**over):
    base = dict(
        slot_mapping=torch.arange(3, dtype=torch.int64),
        block_tables=torch.zeros(1, 2, dtype=torch.int32),
        seq_lens=torch.tensor([3], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        max_query_len=3,
        max_seq_len=3,
    )
    return AttentionMetadata(**{**base, **over})


def test_select_auto_and_torch():
    assert isinstance(select_backend("auto", "cpu"), TorchAttentionBackend)
    assert select_backend("torch", "cpu").name == "torch"
    with pytest.raises(ValueError, match="auto, torch or triton"):
        select_backend("cuda-graphs", "cpu")


def test_select_auto_on_cuda_is_triton(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with caplog.at_level(logging.WARNING):
        backend = select_backend("auto", torch.device("cuda"))
    assert isinstance(backend, TritonAttentionBackend)  # compiled: the interpreter stays off
    assert "TRITON_INTERPRET" not in os.environ and "interpreter" not in caplog.text


def test_select_triton_on_cpu_uses_interpreter(monkeypatch, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with caplog.at_level(logging.WARNING):
        backend = select_backend("triton", "cpu")
    assert backend.name == "triton" and os.environ["TRITON_INTERPRET"] == "1"
    assert "interpreter" in caplog.text


def test_select_triton_on_cpu_sets_interpret_before_import(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    select_backend("triton", "cpu")
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_select_triton_on_cpu_refuses_after_compiled_import(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", object())
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        select_backend("triton", "cpu")


def test_triton_backend_names_missing_kernel(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernels.triton_attention", None)  # as if its import failed
    with pytest.raises(RuntimeError, match="kernels.triton_attention.paged_attention.*not available"):
        TritonAttentionBackend().attend(torch.zeros(3, 2, 4), None, None, _meta(), 1.0)


def test_metadata_validation():
    assert _meta().num_tokens == 3 and _meta().num_seqs == 1
    with pytest.raises(ValueError, match="slot_mapping"):
        _meta(slot_mapping=torch.arange(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="query_start_loc"):
        _meta(query_start_loc=torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_tables"):
        _meta(block_tables=torch.zeros(2, 2, dtype=torch.int32))


def test_kv_cache_shapes_and_budget():
    caches = allocate_kv_caches(3, 5, 4, 2, 8, torch.float32, "cpu")
    assert len(caches) == 3
    assert all(k.shape == v.shape == (5, 4, 2, 8) for k, v in caches)
    per_block = kv_cache_bytes_per_block(3, 4, 2, 8, torch.bfloat16)
    assert per_block == 2 * 3 * 4 * 2 * 8 * 2
    assert num_blocks_for_budget(per_block * 7 + 1, 3, 4, 2, 8, torch.bfloat16) == 7
    with pytest.raises(ValueError):
        allocate_kv_caches(3, 0, 4, 2, 8, torch.float32, "cpu")


def test_torch_backend_copy_blocks():
    caches = allocate_kv_caches(2, 4, 2, 1, 2, torch.float32, "cpu")
    for i, (k, v) in enumerate(caches):
        k[1].fill_(i + 1)
        v[1].fill_(-(i + 1))
    keys, values = [k for k, _ in caches], [v for _, v in caches]
    TorchAttentionBackend().copy_blocks(keys, values, torch.tensor([[1, 3]]))
    for i, (k, v) in enumerate(caches):
        assert torch.all(k[3] == i + 1) and torch.all(v[3] == -(i + 1))


def test_triton_backend_matches_torch_in_model():
    # Through the real model: a mixed batch (prefill after a cached prefix, a fresh
    # prefill, a decode) on the Triton kernels equals the torch reference path.
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1 set before triton import")
    from tests.model.paged_batch import PagedBatchBuilder
    from tests.model.refs import tiny_pair

    ours, _ = tiny_pair("llama")
    spec = ours.spec
    outs = []
    for backend in (TorchAttentionBackend(), select_backend("triton", "cpu")):
        caches = allocate_kv_caches(spec.num_layers, 16, 4, spec.num_kv_heads, spec.head_dim,
                                    torch.float32, "cpu")
        builder = PagedBatchBuilder(16, 4, seed=3)
        toks = list(range(10, 40))
        builder_steps = [[("a", toks[:3]), ("c", toks[:9])],
                         [("a", toks[3:8]), ("b", toks[20:23]), ("c", toks[9:10])]]
        for chunks in builder_steps:
            ids, pos, meta, _ = builder.step(chunks)
            hidden = ours.model(ids, pos, meta, caches, backend)
        outs.append(ours.model.compute_logits(hidden))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-4)

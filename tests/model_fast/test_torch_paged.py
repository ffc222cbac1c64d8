"""The fast CPU paged attention (kernels.torch_paged) against the reference twin."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import torch_cascade
from kernels.reference import paged_attention_ref, reshape_and_cache_ref
from kernels.torch_paged import build_plan, paged_attention_fast, reshape_and_cache_fast


def _ragged_batch(seed: int, block_size: int, kv_heads: int, group: int, head_dim: int = 16):
    """Random caches plus a batch mixing decodes, fresh prefills and chunks over a prefix."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 7 * 70 + 8  # enough for the largest batch at block_size 1
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, seq_lens, starts = [], [], [0]
    for _ in range(rng.randint(1, 7)):
        seq_len = rng.randint(1, 70)
        q_len = rng.choice([1, 1, 1, seq_len, rng.randint(1, seq_len)])
        tables.append([free.pop() for _ in range(-(-seq_len // block_size))])
        seq_lens.append(seq_len)
        starts.append(starts[-1] + q_len)
    width = max(map(len, tables))
    pad = rng.choice([0, -1])  # the runner pads with 0, the tests' builder with -1
    block_tables = torch.tensor([t + [pad] * (width - len(t)) for t in tables], dtype=torch.int32)
    query = torch.randn(starts[-1], kv_heads * group, head_dim, generator=gen)
    return (query, key_cache, value_cache, block_tables,
            torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32))


@pytest.mark.parametrize("seed", range(40))
def test_fast_matches_reference_on_random_ragged_batches(seed):
    block_size = (1, 4, 16)[seed % 3]
    kv_heads, group = ((1, 1), (2, 2), (3, 3), (4, 1))[seed % 4]
    args = _ragged_batch(seed, block_size, kv_heads, group)
    want = paged_attention_ref(*args, scale=0.25)
    got = paged_attention_fast(*args, scale=0.25)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_decode_groups_bound_padding_and_cover_every_decode():
    # 12 decodes: 4 short, 4 medium, 4 long contexts -> several groups, every row once
    lens = [3, 5, 4, 6, 40, 41, 44, 47, 200, 190, 210, 205]
    block_size = 16
    tables = torch.arange(len(lens) * 14, dtype=torch.int32).view(len(lens), 14)
    plan = build_plan(tables, lens, list(range(len(lens) + 1)), block_size)
    rows = sorted(r for g in plan.decode_groups for r in g.rows.tolist())
    assert rows == list(range(len(lens))) and not plan.prefills
    assert len(plan.decode_groups) >= 2
    for g in plan.decode_groups:
        nbs = [-(-lens[r] // block_size) for r in g.rows.tolist()]
        assert g.num_blocks == max(nbs)


def test_plan_reuse_gives_the_same_answer():
    args = _ragged_batch(3, 4, 2, 2)
    plan = build_plan(args[3], args[4], args[5], block_size=4)
    a = paged_attention_fast(*args, scale=0.5, plan=plan)
    b = paged_attention_fast(*args, scale=0.5)
    assert torch.equal(a, b)


@pytest.mark.parametrize("with_padding", [False, True])
def test_fast_cache_write_matches_reference(with_padding):
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(9, 2, 8, generator=gen)
    value = torch.randn(9, 2, 8, generator=gen)
    slots = torch.randperm(40, generator=gen)[:9]
    if with_padding:
        slots[[1, 5]] = -1
    caches = [torch.zeros(10, 4, 2, 8) for _ in range(4)]
    reshape_and_cache_ref(key, value, caches[0], caches[1], slots)
    reshape_and_cache_fast(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def _shared_prefix_batch(seed: int, block_size: int, kv_heads: int, group: int, head_dim: int = 16):
    """Decodes whose tables start with the same physical blocks (a cached shared prompt),
    with tails of different lengths (0 included: no own keys); plus one prefill chunk
    over the same prefix. Odd seeds take the prefix as a run of consecutive block ids
    (as a prompt's blocks come off the free queue), even seeds scattered."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 400
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    shared = [free.pop() for _ in range(rng.randint(4, 9))]
    if seed % 2:
        shared = list(range(200, 200 + len(shared)))
        free = [b for b in free if b not in shared]
    tables, seq_lens, starts = [], [], [0]
    for i in range(rng.randint(2, 9)):
        tail = rng.randint(0, 3 * block_size)
        seq_len = len(shared) * block_size + tail
        q_len = 1 if i else rng.choice([1, 5])
        tables.append(shared + [free.pop() for _ in range(-(-tail // block_size))])
        seq_lens.append(seq_len)
        starts.append(starts[-1] + q_len)
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    query = torch.randn(starts[-1], kv_heads * group, head_dim, generator=gen)
    return (query, key_cache, value_cache, block_tables,
            torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(starts, dtype=torch.int32))


@pytest.mark.parametrize("variant", ["flash", "gemm"])
@pytest.mark.parametrize("seed", range(24))
def test_cascade_over_a_shared_prefix_matches_reference(seed, variant, monkeypatch):
    if variant == "gemm":  # torch without the flash op that returns the log-sum-exp
        monkeypatch.setattr(torch_cascade, "_FLASH_LSE", None)
    else:
        assert torch_cascade._FLASH_LSE is not None
    block_size = (1, 4, 16)[seed % 3]
    kv_heads, group = ((1, 1), (2, 2), (3, 3), (4, 1))[seed % 4]
    args = _shared_prefix_batch(seed, block_size, kv_heads, group)
    plan = build_plan(args[3], args[4], args[5], block_size)
    if len([g for g in plan.decode_groups if g.num_seqs > 1]):
        cascades = [g for g in plan.decode_groups if g.shared is not None]
        assert cascades
        assert all((g.shared_start is not None) == bool(seed % 2) for g in cascades)
    want = paged_attention_ref(*args, scale=0.25)
    got = paged_attention_fast(*args, scale=0.25, plan=plan)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_cascade_finds_the_sharing_subset():
    # 6 decodes share blocks 10..14; 2 others (computed their own copy) do not
    shared = [10, 11, 12, 13, 14]
    tables = [shared + [40 + i] for i in range(6)] + [[20 + 6 * j + k for k in range(6)] for j in range(2)]
    lens = [5 * 4 + 1 + i % 3 for i in range(8)]
    plan = build_plan(torch.tensor(tables, dtype=torch.int32), lens, list(range(9)), 4)
    cascades = [g for g in plan.decode_groups if g.shared is not None]
    assert len(cascades) == 1 and cascades[0].shared.tolist() == shared
    assert sorted(cascades[0].rows.tolist()) == list(range(6))
    rows = sorted(r for g in plan.decode_groups for r in g.rows.tolist())
    assert rows == list(range(8))

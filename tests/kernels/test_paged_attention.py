"""Triton paged attention (decode, split-K, prefill/extend, mixed) against its torch twin.

On CPU these run in Triton's interpreter (tests/conftest.py); the same tests run
compiled on a GPU. Configs cover every block size (8, 16, 32), head_dim (64, 128) and
GQA ratio (1, 3, 4) without the full cartesian product.
"""

import pytest
import torch

from kernels import paged_attention_ref
from kernels.triton_attention import paged_attention
from kernels.triton_decode import decode_num_splits, decode_tile_n, launch_paged_decode
from kernels.triton_prefill import launch_paged_prefill
from tests.kernels.paged_batch import make_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (block_size, head_dim, kv_heads, group)
CONFIGS = [
    pytest.param(8, 64, 2, 3, id="bs8-d64-g3"),
    pytest.param(16, 128, 1, 4, id="bs16-d128-g4"),
    pytest.param(32, 64, 3, 1, id="bs32-d64-g1"),
    pytest.param(32, 128, 2, 3, id="bs32-d128-g3"),
]


def _to(batch, device=DEVICE):
    for name in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"):
        setattr(batch, name, getattr(batch, name).to(device))
    return batch


def _check(batch, atol=2e-5, rtol=1e-4, **kwargs):
    """Run into a NaN-poisoned out; every element must be written and match the twin."""
    out = torch.full_like(batch.query, float("nan"))
    result = paged_attention(*batch.args(), out=out, **kwargs)
    assert result is out
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements never written"
    ref = paged_attention_ref(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in batch.args()))
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=atol, rtol=rtol)
    return out


@pytest.mark.parametrize("block_size,head_dim,kv_heads,group", CONFIGS)
def test_decode_ragged_contexts(block_size, head_dim, kv_heads, group):
    # 1 token, a partial block, exactly full blocks, and many blocks.
    specs = [(1, 1), (1, 37), (1, 4 * block_size), (1, 200)]
    _check(_to(make_batch(specs, block_size=block_size, kv_heads=kv_heads, group=group, head_dim=head_dim)))


@pytest.mark.parametrize("block_size,head_dim,kv_heads,group", CONFIGS)
def test_prefill_chunks_after_cached_prefix(block_size, head_dim, kv_heads, group):
    specs = [
        (23, 23),  # fresh prompt
        (17, 90),  # chunk after an unaligned cached prefix
        (40, 40 + 3 * block_size),  # chunk after a block-aligned prefix
        (2, 2),  # smallest prefill
    ]
    _check(_to(make_batch(specs, block_size=block_size, kv_heads=kv_heads, group=group,
                          head_dim=head_dim, seed=1)))


@pytest.mark.parametrize("block_size,head_dim,kv_heads,group", CONFIGS)
def test_mixed_varlen_batch(block_size, head_dim, kv_heads, group):
    # Decodes interleaved with chunks, plus a sequence with nothing to compute.
    specs = [(1, 70), (19, 19), (1, 5), (0, 12), (30, 150), (1, 1), (3, 40)]
    _check(_to(make_batch(specs, block_size=block_size, kv_heads=kv_heads, group=group,
                          head_dim=head_dim, seed=2)))


@pytest.mark.parametrize("num_splits", [2, 5])
def test_decode_split_k_forced(num_splits):
    specs = [(1, 300), (1, 45), (1, 513), (1, 1)]  # 45 and 1 use fewer splits than the grid has
    batch = _to(make_batch(specs, block_size=16, kv_heads=2, group=4, head_dim=64, seed=3))
    out = torch.full_like(batch.query, float("nan"))
    assert launch_paged_decode(out, *batch.args(), max_seq_len=513, num_splits=num_splits) == num_splits
    assert not out.isnan().any()
    ref = paged_attention_ref(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in batch.args()))
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)


def test_too_small_max_seq_len_hint_is_still_correct():
    # The last split absorbs the tail, so an undersized hint only costs parallelism.
    batch = _to(make_batch([(1, 400), (1, 70)], block_size=16, kv_heads=1, group=2, head_dim=64, seed=9))
    out = torch.full_like(batch.query, float("nan"))
    assert launch_paged_decode(out, *batch.args(), max_seq_len=150, num_splits=2) == 2
    ref = paged_attention_ref(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in batch.args()))
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)


def test_split_k_chosen_for_long_context():
    # One long sequence leaves SMs idle, so the heuristic must split it.
    batch = _to(make_batch([(1, 700), (1, 9)], block_size=8, kv_heads=1, group=3, head_dim=64, seed=4))
    splits, partition = decode_num_splits(2, 1, 700, decode_tile_n(8), batch.query.device)
    assert splits > 1 and partition % decode_tile_n(8) == 0 and splits * partition >= 700
    _check(batch)


def test_prefill_many_small_tiles():
    # BLOCK_M 16 with GROUP 4 gives 4-token tiles: many tiles per chunk, spare tiles in
    # the varlen map, and decode rows the prefill kernel must leave alone.
    specs = [(13, 13), (1, 30), (22, 60), (2, 9)]
    batch = _to(make_batch(specs, block_size=8, kv_heads=1, group=4, head_dim=64, seed=8))
    out = torch.full_like(batch.query, float("nan"))
    launch_paged_prefill(out, *batch.args(), block_m=16)
    ref = paged_attention_ref(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in batch.args()))
    decode_row = 13
    assert out[decode_row].isnan().all(), "prefill kernel wrote a decode row"
    keep = torch.ones(out.shape[0], dtype=torch.bool)
    keep[decode_row] = False
    assert not out[keep].isnan().any()
    torch.testing.assert_close(out[keep].cpu(), ref[keep], atol=2e-5, rtol=1e-4)


def test_hints_skip_the_sync_and_agree():
    specs = [(1, 70), (12, 30), (1, 300)]
    batch = _to(make_batch(specs, block_size=16, kv_heads=1, group=3, head_dim=64, seed=5))
    _check(batch, max_query_len=12, max_seq_len=300)
    decode = _to(make_batch([(1, 70), (1, 300)], block_size=16, kv_heads=1, group=3, head_dim=64, seed=5))
    _check(decode, max_query_len=1, max_seq_len=300)


def test_bf16_strided_query_and_out():
    specs = [(1, 100), (25, 60), (1, 3)]
    batch = _to(make_batch(specs, block_size=16, kv_heads=2, group=3, head_dim=64,
                           dtype=torch.bfloat16, seed=6, strided_query=True))
    assert not batch.query.is_contiguous()
    fused_out = torch.full((batch.query.shape[0], 8, 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = fused_out[:, 1:7]  # strided over tokens
    paged_attention(*batch.args(), out=out)
    assert not out.isnan().any() and fused_out[:, 0].isnan().all() and fused_out[:, 7].isnan().all()
    ref = paged_attention_ref(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in batch.args()))
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=3e-2, rtol=3e-2)


def test_allocates_output_and_handles_empty_batch():
    batch = _to(make_batch([(3, 10)], block_size=8, kv_heads=1, group=1, head_dim=64, seed=7))
    out = paged_attention(*batch.args())
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    empty = _to(make_batch([], block_size=8, kv_heads=1, group=1, head_dim=64))
    assert paged_attention(*empty.args()).shape == (0, 1, 64)


def _bad(field, value):
    def mutate(batch):
        setattr(batch, field, value(batch))
        return batch
    return mutate


BAD = [
    ("query 2d", _bad("query", lambda b: b.query[:, 0]), "query must have 3 dims"),
    ("query int", _bad("query", lambda b: b.query.to(torch.int32)), "query must have dtype"),
    ("cache dtype", _bad("key_cache", lambda b: b.key_cache.half()), "key_cache must have dtype"),
    ("head_dim", _bad("query", lambda b: b.query[..., :32].contiguous()), "head_dim"),
    ("gqa", _bad("query", lambda b: b.query[:, :3].contiguous()), "multiple of num_kv_heads"),
    ("value shape", _bad("value_cache", lambda b: b.value_cache[:-1]), "value_cache must have shape"),
    ("tables dtype", _bad("block_tables", lambda b: b.block_tables.long()), "block_tables must have dtype"),
    ("seq_lens len", _bad("seq_lens", lambda b: b.seq_lens[:1]), "seq_lens must have shape"),
    ("qsl len", _bad("query_start_loc", lambda b: b.query_start_loc[:-1]), "query_start_loc must have shape"),
    ("dim stride", _bad("query", lambda b: b.query.transpose(1, 2).contiguous().transpose(1, 2)), "contiguous"),
    ("q > seq", _bad("seq_lens", lambda b: torch.tensor([1, 5], dtype=torch.int32)), "exceeds seq_len"),
    ("capacity", _bad("seq_lens", lambda b: torch.tensor([4, 999], dtype=torch.int32)), "capacity"),
    ("qsl end", _bad("query_start_loc", lambda b: torch.tensor([0, 4, 4], dtype=torch.int32)), "num_tokens"),
]


@pytest.mark.parametrize("mutate,match", [pytest.param(m, e, id=i) for i, m, e in BAD])
def test_wrapper_rejects_bad_inputs(mutate, match):
    batch = mutate(make_batch([(4, 9), (1, 20)], block_size=8, kv_heads=2, group=2, head_dim=64))
    with pytest.raises((ValueError, TypeError), match=match):
        paged_attention(*_to(batch).args())


def test_wrapper_rejects_bad_out_and_half_hints():
    batch = _to(make_batch([(4, 9)], block_size=8, kv_heads=1, group=2, head_dim=64))
    with pytest.raises(ValueError, match="out must have shape"):
        paged_attention(*batch.args(), out=torch.empty(3, 2, 64, device=DEVICE))
    with pytest.raises(TypeError, match="out must have dtype"):
        paged_attention(*batch.args(), out=torch.empty_like(batch.query, dtype=torch.float16))
    with pytest.raises(ValueError, match="both max_query_len and max_seq_len"):
        paged_attention(*batch.args(), max_query_len=4)


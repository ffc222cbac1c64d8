"""paged_attention: validate once, then dispatch decode rows and prefill chunks.

Twin: kernels.reference.paged_attention_ref (same signature and semantics; shapes in
that module's docstring). Sequences with query length 1 go to the decode kernel
(kernels.triton_decode, split-K); those with length >= 2 go to the prefill/extend
kernel (kernels.triton_prefill). Both kernels read the same metadata and skip the
other's sequences, so a mixed batch needs no reordering or gather.
"""

from __future__ import annotations

import torch

from kernels.triton_checks import FLOAT_DTYPES, check_same_device, check_tensor, require
from kernels.triton_decode import _paged_decode_kernel, launch_paged_decode
from kernels.triton_prefill import launch_paged_prefill


def _check(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out) -> None:
    check_tensor("query", query, ndim=3, dtypes=FLOAT_DTYPES, inner_contiguous=1)
    num_tokens, num_heads, head_dim = query.shape
    check_tensor("key_cache", key_cache, ndim=4, dtypes=(query.dtype,), inner_contiguous=1)
    num_blocks, block_size, kv_heads, cache_head_dim = key_cache.shape
    require(cache_head_dim == head_dim, f"key_cache head_dim {cache_head_dim} != query head_dim {head_dim}")
    require(kv_heads > 0 and num_heads % kv_heads == 0,
            f"num_heads {num_heads} must be a multiple of num_kv_heads {kv_heads}")
    check_tensor("value_cache", value_cache, shape=key_cache.shape, dtypes=(query.dtype,), inner_contiguous=1)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), inner_contiguous=1)
    num_seqs = block_tables.shape[0]
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32,), shape=(num_seqs,), inner_contiguous=1)
    check_tensor("query_start_loc", query_start_loc, dtypes=(torch.int32,), shape=(num_seqs + 1,),
                 inner_contiguous=1)
    if out is not None:
        check_tensor("out", out, shape=query.shape, dtypes=(query.dtype,), inner_contiguous=1)
    tensors = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                   seq_lens=seq_lens, query_start_loc=query_start_loc)
    if out is not None:
        tensors["out"] = out
    check_same_device(_paged_decode_kernel, **tensors)


def _host_lens(seq_lens, query_start_loc, num_tokens, block_size, max_blocks) -> tuple[int, int, bool]:
    """(max_query_len, max_seq_len, any_decode), checking the metadata on the way.

    Costs a device sync; callers that know these numbers pass them instead.
    """
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    require(starts[0] == 0 and starts[-1] == num_tokens,
            f"query_start_loc must run from 0 to num_tokens={num_tokens}, got {starts[0]}..{starts[-1]}")
    require(all(q >= 0 for q in q_lens), "query_start_loc must be non-decreasing")
    for s, (q, n) in enumerate(zip(q_lens, lens)):
        require(q <= n, f"sequence {s}: query length {q} exceeds seq_len {n}")
        require(n <= max_blocks * block_size,
                f"sequence {s}: seq_len {n} exceeds block_tables capacity {max_blocks} x {block_size}")
    return max(q_lens, default=0), max(lens, default=0), 1 in q_lens


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's query chunk over its paged context.

    Same contract as kernels.reference.paged_attention_ref; query and caches share a
    dtype (fp16, bf16 or fp32), accumulation is fp32, output has query's dtype.
    max_query_len / max_seq_len are optional hints (both or neither): with them the
    call never syncs with the device; without them they are read from the metadata,
    which is then also sanity-checked.
    """
    _check(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, out)
    require((max_query_len is None) == (max_seq_len is None), "pass both max_query_len and max_seq_len, or neither")
    if out is None:
        out = torch.empty_like(query)
    num_tokens = query.shape[0]
    if num_tokens == 0 or block_tables.shape[0] == 0:
        return out
    if max_query_len is None:
        max_query_len, max_seq_len, any_decode = _host_lens(
            seq_lens, query_start_loc, num_tokens, key_cache.shape[1], block_tables.shape[1])
    else:
        any_decode = True  # unknown without a sync; the decode launch skips non-decodes cheaply
    args = (out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, float(scale))
    if any_decode:
        launch_paged_decode(*args, max_seq_len=max_seq_len)
    if max_query_len >= 2:
        launch_paged_prefill(*args)
    return out

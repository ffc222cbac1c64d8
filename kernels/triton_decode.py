"""Paged decode attention: one query token per sequence, split-K over long contexts.

Twin: kernels.reference.paged_attention_ref restricted to sequences whose query
length is 1; kernels.triton_attention.paged_attention dispatches here.

Grid (num_seqs, num_kv_heads, num_splits). A program owns every query head of one
KV-head group, so each K/V tile is loaded once per group (GQA) and fed to one
tl.dot. It walks its split's tokens TILE_N at a time, gathering each token's physical
block through the block table, with an online softmax in fp32. With one split it
writes the output; otherwise it writes an unnormalised partial (acc, max, sumexp) and
_decode_reduce_kernel combines the splits. Sequences whose query length is not 1 are
skipped: the prefill kernel owns them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_checks import fp32_dot, next_pow2, num_sms

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp2 is a single instruction
MIN_PARTITION = 256  # tokens; below this a split's partial write outweighs its work
MAX_SPLITS = 64


@triton.jit
def _paged_decode_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]; written only when not WRITE_PARTIAL
    part_acc_ptr,  # fp32 [num_seqs, num_heads, num_splits, head_dim]: unnormalised P@V
    part_ml_ptr,  # fp32 [num_seqs, num_heads, num_splits, 2]: (max in log2 units, sumexp)
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # int32 [num_seqs]: context length including the new token
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    scale_log2,  # softmax scale * log2(e)
    num_splits,  # programs along axis 2
    partition_size,  # tokens per split, a multiple of TILE_N
    stride_qt, stride_qh,  # query token / head strides (head_dim is dense)
    stride_ot, stride_oh,  # out token / head strides
    stride_kb, stride_kt, stride_kh,  # key cache block / slot / head strides
    stride_vb, stride_vt, stride_vh,  # value cache block / slot / head strides
    stride_bt,  # block_tables row stride
    HEAD_DIM: tl.constexpr,  # true head_dim
    HEAD_DIM_PAD: tl.constexpr,  # power of two >= HEAD_DIM
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # power of two >= max(GROUP, 16): tl.dot needs M >= 16
    BLOCK_SIZE: tl.constexpr,  # token slots per cache block
    TILE_N: tl.constexpr,  # keys per inner step (power of two, >= 16)
    WRITE_PARTIAL: tl.constexpr,  # True when num_splits > 1
    FP32_DOT: tl.constexpr,  # exact fp32 dots (no TF32): fp32 inputs, or bf16 when interpreted
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_row
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * partition_size
    if (q_len != 1) | (start >= seq_len):
        return
    # The last split runs to seq_len: a max_seq_len hint that is too small then costs
    # parallelism, not correctness.
    end = tl.where(split == num_splits - 1, seq_len, tl.minimum(start + partition_size, seq_len))

    g = tl.arange(0, GROUP_PAD)  # query head within the group
    d = tl.arange(0, HEAD_DIM_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_ptrs = query_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # [GROUP_PAD, HEAD_DIM_PAD]

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(start, end, TILE_N):
        toks = tile + tl.arange(0, TILE_N)
        t_ok = toks < end
        phys = tl.load(bt_row + toks // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
        slot = toks % BLOCK_SIZE
        kv_ok = t_ok[:, None] & d_ok[None, :]
        k_ptrs = key_cache_ptr + phys[:, None] * stride_kb + slot[:, None] * stride_kt \
            + kv_head * stride_kh + d[None, :]
        v_ptrs = value_cache_ptr + phys[:, None] * stride_vb + slot[:, None] * stride_vt \
            + kv_head * stride_vh + d[None, :]
        k = tl.load(k_ptrs, mask=kv_ok, other=0.0)  # [TILE_N, HEAD_DIM_PAD]
        v = tl.load(v_ptrs, mask=kv_ok, other=0.0)  # [TILE_N, HEAD_DIM_PAD]
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(t_ok[None, :], s * scale_log2, float("-inf"))  # [GROUP_PAD, TILE_N]
        # Every tile holds >= 1 valid token, so m_new is finite from the first tile on.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    row_ok = g_ok[:, None] & d_ok[None, :]
    if WRITE_PARTIAL:
        part = (seq.to(tl.int64) * (GROUP * tl.num_programs(1)) + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok)
        tl.store(part_ml_ptr + part * 2, m_i, mask=g_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=g_ok)
    else:
        o_ptrs = out_ptr + q_row.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    part_acc_ptr,  # fp32 [num_seqs, num_heads, num_splits, head_dim]
    part_ml_ptr,  # fp32 [num_seqs, num_heads, num_splits, 2]
    seq_lens_ptr,  # int32 [num_seqs]
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    num_splits,  # splits written per (seq, head); only those covering seq_len are valid
    partition_size,  # tokens per split
    stride_ot, stride_oh,  # out token / head strides
    HEAD_DIM: tl.constexpr,  # true head_dim
    HEAD_DIM_PAD: tl.constexpr,  # power of two >= HEAD_DIM
    SPLITS_PAD: tl.constexpr,  # power of two >= num_splits
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_row = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_row
    if q_len != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    valid = tl.minimum((seq_len + partition_size - 1) // partition_size, num_splits)  # splits that saw tokens
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM_PAD)
    sp_ok = sp < valid
    part = (seq.to(tl.int64) * tl.num_programs(1) + head) * num_splits + sp
    m_s = tl.load(part_ml_ptr + part * 2, mask=sp_ok, other=float("-inf"))
    l_s = tl.load(part_ml_ptr + part * 2 + 1, mask=sp_ok, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :],
                  mask=sp_ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)  # [SPLITS_PAD, HEAD_DIM_PAD]
    m_all = tl.max(m_s, axis=0)
    w = tl.where(sp_ok, tl.exp2(m_s - m_all), 0.0)  # rescale each split to the global max
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    o_ptrs = out_ptr + q_row.to(tl.int64) * stride_ot + head * stride_oh + d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def decode_tile_n(block_size: int) -> int:
    """Keys per inner step: at least 64 so small blocks still give each load a wide tile
    (64 tokens x head_dim 64 x bf16 = 8 KiB of K and of V in flight per step)."""
    return max(64, next_pow2(block_size))


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, tile_n: int,
                      device: torch.device) -> tuple[int, int]:
    """(num_splits, partition_size) for the decode grid.

    Split only when the (seq, kv_head) grid alone would leave SMs idle: aim for about
    two programs per SM, never below MIN_PARTITION tokens per split.
    """
    by_context = triton.cdiv(max(max_seq_len, 1), MIN_PARTITION)
    wanted = triton.cdiv(2 * num_sms(device), max(num_seqs * num_kv_heads, 1))
    splits = max(1, min(by_context, wanted, MAX_SPLITS))
    partition = triton.cdiv(triton.cdiv(max(max_seq_len, 1), splits), tile_n) * tile_n
    return triton.cdiv(max(max_seq_len, 1), partition), partition


def launch_paged_decode(
    out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
    scale: float, max_seq_len: int, num_splits: int | None = None, tile_n: int | None = None,
    num_warps: int = 4,
) -> int:
    """Launch decode (+ reduce) over already-validated tensors; see paged_attention.

    num_splits / tile_n / num_warps override the defaults (tests force split-K with
    them; bench/gpu_kernels.py sweeps them).
    Returns the number of splits launched.
    """
    num_seqs = seq_lens.shape[0]
    _, num_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    tile_n = tile_n or decode_tile_n(block_size)
    if num_splits is None:
        num_splits, partition = decode_num_splits(num_seqs, kv_heads, max_seq_len, tile_n, query.device)
    else:
        partition = triton.cdiv(triton.cdiv(max(max_seq_len, 1), num_splits), tile_n) * tile_n
        num_splits = triton.cdiv(max(max_seq_len, 1), partition)
    group = num_heads // kv_heads
    write_partial = num_splits > 1
    if write_partial:
        part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        part_ml = torch.empty(num_seqs, num_heads, num_splits, 2, dtype=torch.float32, device=query.device)
    else:
        part_acc = part_ml = out  # never touched: WRITE_PARTIAL is False
    _paged_decode_kernel[(num_seqs, kv_heads, num_splits)](
        out_ptr=out, part_acc_ptr=part_acc, part_ml_ptr=part_ml,
        query_ptr=query, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
        block_tables_ptr=block_tables, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
        scale_log2=scale * LOG2E, num_splits=num_splits, partition_size=partition,
        stride_qt=query.stride(0), stride_qh=query.stride(1),
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_kb=key_cache.stride(0), stride_kt=key_cache.stride(1), stride_kh=key_cache.stride(2),
        stride_vb=value_cache.stride(0), stride_vt=value_cache.stride(1), stride_vh=value_cache.stride(2),
        stride_bt=block_tables.stride(0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)),
        BLOCK_SIZE=block_size, TILE_N=tile_n,
        WRITE_PARTIAL=write_partial, FP32_DOT=fp32_dot(query.dtype, _paged_decode_kernel),
        num_warps=num_warps,
    )
    if write_partial:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out_ptr=out, part_acc_ptr=part_acc, part_ml_ptr=part_ml,
            seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
            num_splits=num_splits, partition_size=partition,
            stride_ot=out.stride(0), stride_oh=out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), SPLITS_PAD=next_pow2(num_splits),
        )
    return num_splits

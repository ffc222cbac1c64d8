"""Paged prefill/extend attention: query chunks over their cached prefix, causally.

Twin: kernels.reference.paged_attention_ref restricted to sequences whose query
length is >= 2; kernels.triton_attention.paged_attention dispatches here.

Grid (num_q_tiles, num_kv_heads). A tile is BLOCK_Q query tokens of one sequence times
the GROUP query heads sharing a KV head, flattened into BLOCK_M = BLOCK_Q * GROUP rows
(row r = token r // GROUP, head r % GROUP), so each K/V tile is loaded once per group.
Varlen tile map without a host sync: sequence s owns tiles
[query_start_loc[s] // BLOCK_Q + s, query_start_loc[s+1] // BLOCK_Q + s + 1), which is
always >= ceil(q_len / BLOCK_Q) tiles, so the grid has num_tokens // BLOCK_Q + num_seqs
tiles and each program finds its sequence by binary search; spare tiles exit at once.
Keys are walked TILE_N at a time through the block table with fp32 online softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_checks import fp32_dot, next_pow2

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp2 is a single instruction
BLOCK_M = 64  # rows (query token x head) per program: fills an MMA tile


@triton.jit
def _tile_seq(
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    tile,  # this program's tile index
    num_seqs,
    BLOCK_Q: tl.constexpr,  # query tokens per tile
):
    """Largest s with query_start_loc[s] // BLOCK_Q + s <= tile (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_prefill_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    query_ptr,  # [num_tokens, num_heads, head_dim]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # int32 [num_seqs]: context length including this chunk
    query_start_loc_ptr,  # int32 [num_seqs + 1]
    scale_log2,  # softmax scale * log2(e)
    num_seqs,
    stride_qt, stride_qh,  # query token / head strides (head_dim is dense)
    stride_ot, stride_oh,  # out token / head strides
    stride_kb, stride_kt, stride_kh,  # key cache block / slot / head strides
    stride_vb, stride_vt, stride_vh,  # value cache block / slot / head strides
    stride_bt,  # block_tables row stride
    HEAD_DIM: tl.constexpr,  # true head_dim
    HEAD_DIM_PAD: tl.constexpr,  # power of two >= HEAD_DIM
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_Q: tl.constexpr,  # query tokens per tile = BLOCK_M // GROUP
    BLOCK_M: tl.constexpr,  # power of two >= BLOCK_Q * GROUP, >= 16
    BLOCK_SIZE: tl.constexpr,  # token slots per cache block
    TILE_N: tl.constexpr,  # keys per inner step (power of two, >= 16)
    FP32_DOT: tl.constexpr,  # exact fp32 dots (no TF32): fp32 inputs, or bf16 when interpreted
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _tile_seq(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local = tile - (q_start // BLOCK_Q + seq)  # tile index within this sequence
    # Query length 1 belongs to the decode kernel; 0 has nothing to do.
    if (q_len < 2) | (local * BLOCK_Q >= q_len):
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len  # cached tokens before this chunk

    r = tl.arange(0, BLOCK_M)
    qi = local * BLOCK_Q + r // GROUP  # query token within the chunk
    heads = kv_head * GROUP + r % GROUP
    r_ok = (r < BLOCK_Q * GROUP) & (qi < q_len)
    d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = d < HEAD_DIM
    tok_rows = (q_start + qi).to(tl.int64)
    q_ptrs = query_ptr + tok_rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    q_pos = prefix + qi  # absolute position; key 0 is visible to every row (finite max)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    # Causal horizon of the tile's last query token.
    kv_end = tl.minimum(prefix + (local + 1) * BLOCK_Q, seq_len)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_start in range(0, kv_end, TILE_N):
        toks = tile_start + tl.arange(0, TILE_N)
        t_ok = toks < kv_end
        phys = tl.load(bt_row + toks // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
        slot = toks % BLOCK_SIZE
        k_ptrs = key_cache_ptr + phys[None, :] * stride_kb + slot[None, :] * stride_kt \
            + kv_head * stride_kh + d[:, None]
        v_ptrs = value_cache_ptr + phys[:, None] * stride_vb + slot[:, None] * stride_vt \
            + kv_head * stride_vh + d[None, :]
        k_t = tl.load(k_ptrs, mask=d_ok[:, None] & t_ok[None, :], other=0.0)  # [HEAD_DIM_PAD, TILE_N]
        v = tl.load(v_ptrs, mask=t_ok[:, None] & d_ok[None, :], other=0.0)  # [TILE_N, HEAD_DIM_PAD]
        if FP32_DOT:
            s = tl.dot(q.to(tl.float32), k_t.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k_t)
        visible = (toks[None, :] <= q_pos[:, None]) & t_ok[None, :]
        s = tl.where(visible, s * scale_log2, float("-inf"))  # [BLOCK_M, TILE_N]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if FP32_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    o_ptrs = out_ptr + tok_rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])


def prefill_tile_n(block_size: int) -> int:
    """Keys per inner step: 64 (a square 64 x 64 score tile with BLOCK_M), or a whole block."""
    return max(64, next_pow2(block_size))


def launch_paged_prefill(
    out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
    scale: float, block_m: int = BLOCK_M, tile_n: int | None = None,
) -> None:
    """Launch the prefill kernel over already-validated tensors; see paged_attention."""
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    _, block_size, kv_heads, _ = key_cache.shape
    group = num_heads // kv_heads
    block_m = max(block_m, 16, next_pow2(group))
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, kv_heads)
    _paged_prefill_kernel[grid](
        out_ptr=out, query_ptr=query, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
        block_tables_ptr=block_tables, seq_lens_ptr=seq_lens, query_start_loc_ptr=query_start_loc,
        scale_log2=scale * LOG2E, num_seqs=num_seqs,
        stride_qt=query.stride(0), stride_qh=query.stride(1),
        stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_kb=key_cache.stride(0), stride_kt=key_cache.stride(1), stride_kh=key_cache.stride(2),
        stride_vb=value_cache.stride(0), stride_vt=value_cache.stride(1), stride_vh=value_cache.stride(2),
        stride_bt=block_tables.stride(0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m,
        BLOCK_SIZE=block_size, TILE_N=tile_n or prefill_tile_n(block_size),
        FP32_DOT=fp32_dot(query.dtype, _paged_prefill_kernel),
    )

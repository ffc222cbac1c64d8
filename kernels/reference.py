"""Torch reference twins of the Triton kernels; also the engine's CPU attention path.

Shapes (shared with the Triton kernels in this package):
- key/value:            [num_tokens, num_kv_heads, head_dim]
- key_cache/value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
- slot_mapping:         int64 [num_tokens]; slot = block_id * block_size + offset,
                        negative = do not write (padding)
- query / output:       [num_tokens, num_heads, head_dim], num_heads % num_kv_heads == 0
- block_tables:         int32 [num_seqs, max_blocks_per_seq]; entries past a
                        sequence's last block are ignored
- seq_lens:             int32 [num_seqs]; context length per sequence INCLUDING this
                        step's new tokens, whose K/V are already in the cache
- query_start_loc:      int32 [num_seqs + 1]; cumulative query lengths

Query token j (0-based) of sequence s, whose chunk has q_s tokens, sits at absolute
position seq_lens[s] - q_s + j and attends causally to cache positions
0 .. seq_lens[s] - q_s + j. A decode is simply q_s == 1.
"""

from __future__ import annotations

import torch


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new K/V rows into the paged cache, in place, by slot."""
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    flat_k = key_cache.view(num_blocks * block_size, kv_heads, head_dim)
    flat_v = value_cache.view(num_blocks * block_size, kv_heads, head_dim)
    flat_k[slots] = key[valid].to(key_cache.dtype)
    flat_v[slots] = value[valid].to(value_cache.dtype)


def gather_kv_ref(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """Contiguous [seq_len, kv_heads, head_dim] view of one sequence's paged K or V."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [nb, bs, kvh, hd]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's query chunk over its paged context."""
    num_heads = query.shape[1]
    kv_heads = key_cache.shape[2]
    group = num_heads // kv_heads
    if out is None:
        out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        q0, q1 = starts[s], starts[s + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        k = gather_kv_ref(key_cache, block_tables[s], seq_len).float()
        v = gather_kv_ref(value_cache, block_tables[s], seq_len).float()
        # [kv_heads, group, q_len, hd] against [kv_heads, seq_len, hd]
        q = query[q0:q1].float().view(q_len, kv_heads, group, -1).permute(1, 2, 0, 3)
        scores = torch.matmul(q, k.permute(1, 2, 0).unsqueeze(1)) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=scores.device).view(-1, 1)
        k_pos = torch.arange(seq_len, device=scores.device).view(1, -1)
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.matmul(probs, v.permute(1, 0, 2).unsqueeze(1))  # [kvh, g, q_len, hd]
        out[q0:q1] = o.permute(2, 0, 1, 3).reshape(q_len, num_heads, -1).to(out.dtype)
    return out


def copy_blocks_ref(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy whole blocks src → dst in every layer's caches (copy-on-write)."""
    if block_mapping.numel() == 0:
        return
    src = block_mapping[:, 0].long()
    dst = block_mapping[:, 1].long()
    for kc, vc in zip(key_caches, value_caches):
        kc[dst] = kc[src]
        vc[dst] = vc[src]

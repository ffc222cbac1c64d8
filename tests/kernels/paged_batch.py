"""Random paged-attention batches for the kernel tests.

Physical blocks are handed out in a random permutation (so block tables are
shuffled and non-contiguous), every cache block holds random data (so reading a wrong
block shows up as a mismatch), and block-table entries past a sequence's last block
point at random other blocks (so reading them shows up too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    scale: float

    def args(self) -> tuple:
        return (self.query, self.key_cache, self.value_cache, self.block_tables,
                self.seq_lens, self.query_start_loc, self.scale)


def make_batch(
    specs: list[tuple[int, int]],  # (query_len, seq_len) per sequence
    *,
    block_size: int,
    kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    strided_query: bool = False,
) -> PagedBatch:
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for _, n in specs]
    max_blocks = max(per_seq, default=0) + 2
    num_blocks = sum(per_seq) + 4
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.randint(0, num_blocks, (len(specs), max_blocks), generator=g, dtype=torch.int32)
    used = 0
    for s, nb in enumerate(per_seq):
        tables[s, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=g).to(dtype)
    value_cache = torch.randn(shape, generator=g).to(dtype)
    num_tokens = sum(q for q, _ in specs)
    num_heads = kv_heads * group
    if strided_query:  # a slice of a fused QKV-like buffer: token stride > heads * dim
        fused = torch.randn(num_tokens, num_heads + 2 * kv_heads, head_dim, generator=g).to(dtype)
        query = fused[:, :num_heads]
    else:
        query = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    starts = [0]
    for q, _ in specs:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables,
        seq_lens=torch.tensor([n for _, n in specs], dtype=torch.int32),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        scale=head_dim ** -0.5,
    )

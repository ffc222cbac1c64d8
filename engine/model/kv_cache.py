"""Paged K/V cache tensors: allocation and the memory one block costs."""

from __future__ import annotations

import torch

KVCache = tuple[torch.Tensor, torch.Tensor]  # (key_cache, value_cache), one per layer


def kv_cache_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one logical block id costs across all layers, K and V together."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def num_blocks_for_budget(
    budget_bytes: int,
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    """How many blocks fit in `budget_bytes` (floor)."""
    per_block = kv_cache_bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
    return budget_bytes // per_block


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[KVCache]:
    """One (key_cache, value_cache) pair per layer, each
    [num_blocks, block_size, num_kv_heads, head_dim], zero-filled.

    Zeros rather than empty: a slot never written is never read by correct code, but
    zeros keep a bug from turning into NaNs that hide where it came from.
    """
    if min(num_layers, num_blocks, block_size, num_kv_heads, head_dim) <= 0:
        raise ValueError(
            "allocate_kv_caches needs positive sizes, got "
            f"layers={num_layers} blocks={num_blocks} block_size={block_size} "
            f"kv_heads={num_kv_heads} head_dim={head_dim}"
        )
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(num_layers)
    ]

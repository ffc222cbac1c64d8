"""Copy whole blocks of a paged K or V cache out into contiguous rows (CPU paths)."""

from __future__ import annotations

import torch


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """[len(blocks) * bs, kvh, hd], contiguous: the blocks' token rows in order.

    `index_select` over whole blocks of the contiguous cache is several times faster
    than advanced indexing (or gathering a permuted view) on the CPU.
    """
    num_blocks, bs, kvh, hd = cache.shape
    rows = cache.view(num_blocks, bs * kvh * hd).index_select(0, blocks)
    return rows.view(blocks.shape[0] * bs, kvh, hd)

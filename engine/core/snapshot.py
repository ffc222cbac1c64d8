"""The engine's true state in the protocol's snapshot shape (see engine.events.reducer).

Block ``num_tokens`` = filled slots: for a referenced block, the most any owner
has computed into it; a free cached block is full; a free uncached block holds
nothing worth counting.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.request import Request


def build_snapshot(step: int, kv: "KVCacheManager", requests: Iterable["Request"],
                   tokens: bool = True) -> dict:
    """``tokens=False`` leaves token ids out (None): enough for metrics, much cheaper."""
    bs = kv.block_size
    fill = [0] * len(kv.pool.blocks)
    reqs = {}
    for r in sorted(requests, key=lambda r: r.sort_key):
        table = kv.tables.get(r.request_id, [])
        for i, b in enumerate(table):
            fill[b.id] = max(fill[b.id], min(bs, max(0, r.num_computed_tokens - i * bs)))
        reqs[r.request_id] = {
            "status": r.status.value,
            "block_table": [b.id for b in table],
            "num_tokens": r.num_tokens,
            "num_computed_tokens": r.num_computed_tokens,
            "num_cached_tokens": r.num_cached_tokens,
            "token_ids": list(r.token_ids) if tokens else None,
            "parent_id": r.parent_id,
            "arrival_index": r.arrival_index,
        }
    blocks = []
    for b in kv.pool.blocks:
        if b.ref_count > 0:
            n = fill[b.id]
        else:
            n = bs if b.hash is not None else 0
        blocks.append({
            "id": b.id,
            "ref_count": b.ref_count,
            "hash": b.hash,
            "num_tokens": n,
            "token_ids": list(b.token_ids) if tokens and b.token_ids is not None else None,
        })
    return {
        "step": step,
        "block_size": bs,
        "num_blocks": len(kv.pool.blocks),
        "blocks": blocks,
        "free_queue": kv.pool.free_queue.ids(),
        "requests": reqs,
    }

"""The engine's true state as the events' types: a ``PoolSnapshot`` or a ``PoolSummary``.

Both come from the manager's tables and pool and the scheduler's requests; the
fill of each block is ``engine.events.metrics.pool_summary``'s (the one definition).
Writer: none (read-only views built on demand by ``Scheduler.snapshot`` and
``Scheduler.pool_summary``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine.events.folds.pool_snapshot import PoolSnapshot, RequestView
from engine.events.metrics.pool_summary import PoolSummary

if TYPE_CHECKING:
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.request import Request


def build_snapshot(step: int, kv: KVCacheManager, requests: Iterable[Request],
                   tokens: bool = True) -> PoolSnapshot:
    """``tokens=False`` leaves token ids out (None): enough for metrics, much cheaper."""
    views = []
    for r in sorted(requests, key=lambda r: r.sort_key):
        views.append(RequestView(
            r.request_id, r.status, tuple(b.id for b in kv.tables.get(r.request_id, ())),
            r.num_tokens, r.num_computed_tokens, r.num_cached_tokens,
            tuple(r.token_ids) if tokens else None, r.parent_id, r.arrival_index))
    blocks = kv.pool.blocks
    return PoolSnapshot.build(
        step, kv.block_size, [b.ref_count for b in blocks], [b.hash for b in blocks],
        [b.token_ids if tokens else None for b in blocks], kv.pool.free_queue.ids(), views)


def summarize_pool(step: int, kv: KVCacheManager, running: Iterable[Request],
                   waiting: Iterable[Request]) -> PoolSummary:
    """The summary of the live state: O(table entries of ``running``), not O(pool).
    Only running requests hold blocks (admission allocates, preemption frees them all),
    so a long waiting queue costs a status count, not a table walk."""
    running = list(running)
    empty: tuple = ()
    return PoolSummary.from_tables(
        step, kv.block_size, len(kv.pool.blocks), kv.pool.num_free, kv.pool.num_cached_free,
        [([b.id for b in kv.tables.get(r.request_id, empty)], r.num_computed_tokens)
         for r in running],
        [*(r.status for r in running), *(r.status for r in waiting)])

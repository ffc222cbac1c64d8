"""A block's fill (the one definition) and ``PoolSummary``, the counts per-step metrics need.

Fill: a logical block ``i`` of a request that has computed ``c`` tokens holds
``min(max(c - i * block_size, 0), block_size)`` filled slots (``slots_filled``).
A physical block's fill is the most any table holding it has computed into it,
so a shared block counts once, at its fullest (``fill_by_block``). The snapshot
builder (``PoolSnapshot.build``), the summaries and the renderers all use these
two functions; nothing else computes a fill.

``PoolSummary.from_tables`` summarises live tables without building a snapshot:
building one (a view per block) cost ~13 ms a step with a 1024-block pool, while
this follows the blocks in use, not the pool size. ``PoolSnapshot.summary`` counts
the same figures from a snapshot's blocks; both agree on every state
(tests/core/test_pool_summary.py checks it after every step of random runs).

Writer: none (values). Built by ``Scheduler.pool_summary`` (live engine),
``PoolState.summary`` (folded events) and ``PoolSnapshot.summary``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events.schema.request_status import LIVE_STATUSES, RequestStatus


def slots_filled(num_computed_tokens: int, logical_index: int, block_size: int) -> int:
    """Filled slots of a request's logical block ``logical_index``."""
    return min(max(num_computed_tokens - logical_index * block_size, 0), block_size)


def fill_by_block(tables: Iterable[tuple[Sequence[int], int]],
                  block_size: int) -> tuple[dict[int, int], int]:
    """(block id → filled slots for every block some table holds, how many of those
    blocks more than one table entry holds).

    ``tables``: (physical block ids in logical order, num_computed_tokens) per request.
    """
    fill: dict[int, int] = {}
    shared: set[int] = set()
    for table, computed in tables:
        for i, b in enumerate(table):
            n = min(max(computed - i * block_size, 0), block_size)  # = slots_filled
            old = fill.get(b)
            if old is None:
                fill[b] = n
            else:
                shared.add(b)
                if n > old:
                    fill[b] = n
    return fill, len(shared)


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """Block and request counts of one moment (a block is *used* when ref_count > 0).

    ``num_filled_slots``: the fill (module docstring) summed over used blocks.
    """

    step: int
    block_size: int
    num_blocks: int
    num_used_blocks: int
    num_filled_slots: int
    num_shared_blocks: int  # ref_count > 1
    num_cached_free_blocks: int  # ref_count 0 with a hash: still hittable
    num_requests_waiting: int  # status waiting (preempted ones excluded)
    num_requests_running: int
    num_requests_preempted: int

    @classmethod
    def from_tables(cls, step: int, block_size: int, num_blocks: int, num_free_blocks: int,
                    num_cached_free_blocks: int, tables: Iterable[tuple[Sequence[int], int]],
                    statuses: Iterable[RequestStatus]) -> PoolSummary:
        """The summary of live tables: O(table entries), not O(pool).

        ``tables`` as in ``fill_by_block``; every used block is in some table."""
        fill, num_shared = fill_by_block(tables, block_size)
        counts = dict.fromkeys(LIVE_STATUSES, 0)
        for s in statuses:
            if s in counts:
                counts[s] += 1
        return cls(
            step=step, block_size=block_size, num_blocks=num_blocks,
            num_used_blocks=num_blocks - num_free_blocks,
            num_filled_slots=sum(fill.values()), num_shared_blocks=num_shared,
            num_cached_free_blocks=num_cached_free_blocks,
            num_requests_waiting=counts[RequestStatus.WAITING],
            num_requests_running=counts[RequestStatus.RUNNING],
            num_requests_preempted=counts[RequestStatus.PREEMPTED],
        )

    def figures(self) -> dict[str, Any]:
        """Usage and fragmentation (definitions in engine.events.metrics.step_metrics)."""
        used, filled = self.num_used_blocks, self.num_filled_slots
        return {
            "kv_cache_usage": used / self.num_blocks,
            "kv_token_usage": filled / (self.num_blocks * self.block_size),
            "internal_fragmentation": 1.0 - filled / (used * self.block_size) if used else 0.0,
            "num_used_blocks": used,
            "num_filled_slots": filled,
            "num_free_blocks": self.num_blocks - used,
            "num_shared_blocks": self.num_shared_blocks,
            "num_cached_free_blocks": self.num_cached_free_blocks,
        }

    def request_counts(self) -> dict[str, int]:
        return {"num_requests_waiting": self.num_requests_waiting,
                "num_requests_running": self.num_requests_running,
                "num_requests_preempted": self.num_requests_preempted}

"""PoolSummary: the counts per-step metrics need, without building a snapshot.

The engine publishes metrics every step. Building the full snapshot for that (one
dict per block) cost ~13 ms a step with a 1024-block pool; the counts below come
from the free queue, the hash map and the live block tables instead, so their cost
follows the blocks in use, not the pool size.

Writer: ``Scheduler.pool_summary`` for the live engine; ``summarize_snapshot`` for a
snapshot dict (replays, hand-built states). Both give the same summary for the same
state (tests/core/test_pool_summary.py checks it on every step of real runs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.request import Request

_STATUSES = ("waiting", "running", "preempted")


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """Block and request counts of one moment (a block is *used* when ref_count > 0).

    ``num_filled_slots``: over used blocks, each counted once, the most any owner has
    computed into it.
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

    def figures(self) -> dict[str, Any]:
        """Usage and fragmentation (definitions in engine.events.metrics)."""
        used, filled = self.num_used_blocks, self.num_filled_slots
        return {
            "kv_cache_usage": used / self.num_blocks,
            "kv_token_usage": filled / (self.num_blocks * self.block_size),
            "internal_fragmentation": 1.0 - filled / (used * self.block_size) if used else 0.0,
            "num_used_blocks": used,
            "num_free_blocks": self.num_blocks - used,
            "num_shared_blocks": self.num_shared_blocks,
            "num_cached_free_blocks": self.num_cached_free_blocks,
        }

    def request_counts(self) -> dict[str, int]:
        return {f"num_requests_{s}": getattr(self, f"num_requests_{s}") for s in _STATUSES}


def summarize_manager(step: int, kv: "KVCacheManager", requests: Iterable["Request"]) -> PoolSummary:
    """The summary of the live state: O(table entries of ``requests``), not O(pool)."""
    bs = kv.block_size
    filled = 0
    shared_fill: dict[int, int] = {}  # block id -> most filled slots over its owners
    counts = dict.fromkeys(_STATUSES, 0)
    for r in requests:
        status = r.status.value
        if status in counts:
            counts[status] += 1
        table = kv.tables.get(r.request_id, ())
        computed = r.num_computed_tokens
        # this request fills min(computed, len(table) * bs) slots of its table; the
        # shared blocks among them are counted once, below, at their fullest
        filled += min(computed, len(table) * bs)
        for i, b in [(i, b) for i, b in enumerate(table) if b.ref_count != 1]:
            n = min(bs, max(0, computed - i * bs))
            filled -= n
            if n > shared_fill.get(b.id, -1):
                shared_fill[b.id] = n
    num_blocks = len(kv.pool.blocks)
    return PoolSummary(
        step=step, block_size=bs, num_blocks=num_blocks,
        num_used_blocks=num_blocks - kv.pool.num_free,
        num_filled_slots=filled + sum(shared_fill.values()),
        num_shared_blocks=len(shared_fill),
        num_cached_free_blocks=kv.pool.num_cached_free,
        num_requests_waiting=counts["waiting"], num_requests_running=counts["running"],
        num_requests_preempted=counts["preempted"],
    )


def summarize_snapshot(snapshot: dict[str, Any]) -> PoolSummary:
    """The summary of a snapshot dict (the protocol's shape, see engine.core.snapshot)."""
    used = filled = shared = cached_free = 0
    for b in snapshot["blocks"]:
        if b["ref_count"] > 0:
            used += 1
            filled += b["num_tokens"]
            shared += b["ref_count"] > 1
        elif b["hash"] is not None:
            cached_free += 1
    statuses = [r["status"] for r in snapshot["requests"].values()]
    return PoolSummary(
        step=snapshot.get("step", 0), block_size=snapshot["block_size"],
        num_blocks=snapshot["num_blocks"], num_used_blocks=used, num_filled_slots=filled,
        num_shared_blocks=shared, num_cached_free_blocks=cached_free,
        num_requests_waiting=statuses.count("waiting"),
        num_requests_running=statuses.count("running"),
        num_requests_preempted=statuses.count("preempted"),
    )

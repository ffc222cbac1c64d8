"""``PoolState``: the mutable folded pool, built up one protocol event at a time.

Holds per-block ref counts, hashes and tokens, the free queue and the requests;
``to_snapshot`` turns it into a ``PoolSnapshot`` and ``summary`` into a
``PoolSummary``. ``check`` asserts the invariants between them.

Writer: ``apply_event``, through the per-event rules in ``engine.events.folds.rules``
(construction aside: ``from_snapshot`` and ``copy``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from engine.events.folds.fold import Fold
from engine.events.folds.folded_request import FoldedRequest
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.rules import HANDLERS, ImpossibleEventError
from engine.events.metrics.pool_summary import PoolSummary
from engine.events.schema.request_status import RequestStatus
from engine.events.schema.types import Event, event_from_dict


class PoolState(Fold):
    """Mutable folded state; O(1) per block event (O(table) for a few request events)."""

    __slots__ = ("step", "block_size", "num_blocks", "ref", "hash", "block_tokens", "free",
                 "requests")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.step = 0
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash: list[str | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        # An OrderedDict is the reducer's doubly linked list: O(1) pop from the
        # middle (hits, allocation) and push at either end (hashless → head).
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.requests: dict[str, FoldedRequest] = {}

    # ---- construction ------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snap: PoolSnapshot | dict[str, Any]) -> PoolState:
        """Rebuild a PoolState from a snapshot or its JSON form (validated with ``check``)."""
        if isinstance(snap, dict):
            snap = PoolSnapshot.from_dict(snap)
        s = cls(snap.num_blocks, snap.block_size)
        s.step = snap.step
        for b in snap.blocks:
            s.ref[b.id], s.hash[b.id], s.block_tokens[b.id] = b.ref_count, b.hash, b.token_ids
        s.free = OrderedDict.fromkeys(snap.free_queue)
        s.requests = {rid: FoldedRequest.from_view(r) for rid, r in snap.requests.items()}
        s.check(statuses=False)  # may be a mid-step state (blocks before request_scheduled)
        return s

    def copy(self) -> PoolState:
        """An independent copy (no list or request record is shared)."""
        s = PoolState.__new__(PoolState)
        s.step, s.block_size, s.num_blocks = self.step, self.block_size, self.num_blocks
        s.ref, s.hash, s.block_tokens = list(self.ref), list(self.hash), list(self.block_tokens)
        s.free = OrderedDict(self.free)
        s.requests = {rid: r.copy() for rid, r in self.requests.items()}
        return s

    # ---- folding -----------------------------------------------------------

    def apply_event(self, event: Event | dict[str, Any]) -> None:
        """Fold one event (typed or its v2 dict form) into this state, in place."""
        if isinstance(event, dict):
            event = event_from_dict(event)
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise ImpossibleEventError(f"no reducer rule for event type {event.type!r}")
        self.step = event.step
        handler(self, event)


    # ---- output ------------------------------------------------------------

    def to_snapshot(self) -> PoolSnapshot:
        """The snapshot of this state (fresh values; safe to hand out)."""
        return PoolSnapshot.build(self.step, self.block_size, self.ref, self.hash,
                                  self.block_tokens, self.free,
                                  (r.view(rid) for rid, r in self.requests.items()))

    def summary(self) -> PoolSummary:
        """``to_snapshot().summary()`` without building the snapshot."""
        return PoolSummary.from_tables(
            self.step, self.block_size, self.num_blocks, len(self.free),
            sum(1 for b in self.free if self.hash[b] is not None),
            [(r.table, r.num_computed_tokens) for r in self.requests.values()],
            [r.status for r in self.requests.values()])

    def check(self, statuses: bool = True) -> None:
        """Assert invariants: refs = table occurrences, free queue = ref-0 blocks and
        (with ``statuses``, true between steps only) no waiting/preempted table."""
        counts = [0] * self.num_blocks
        for rid, r in self.requests.items():
            for b in r.table:
                if not (isinstance(b, int) and 0 <= b < self.num_blocks):
                    raise ImpossibleEventError(f"request {rid!r} holds block {b!r}, not in a "
                                               f"pool of {self.num_blocks}")
                counts[b] += 1
            if statuses and r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) \
                    and r.table:
                raise ImpossibleEventError(f"{r.status} request {rid!r} holds blocks {r.table}")
        if counts != self.ref:
            bad = [i for i in range(self.num_blocks) if counts[i] != self.ref[i]]
            raise ImpossibleEventError(f"ref counts disagree with block tables at blocks {bad}")
        free = {i for i in range(self.num_blocks) if self.ref[i] == 0}
        if free != set(self.free) or len(self.free) != len(free):
            raise ImpossibleEventError("free queue does not hold exactly the ref-0 blocks")

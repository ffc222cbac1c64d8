"""``PoolState``: the mutable folded pool, built up one protocol event at a time.

Holds per-block ref counts, hashes and tokens, the free queue and the requests;
``to_snapshot`` turns it into the snapshot dict described in
``engine.events.reducer``. ``check`` asserts the invariants between them.

Writer: ``apply_event``, through the per-event rules in ``engine.events.rules``
(construction aside: ``from_snapshot`` and ``copy``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from engine.events import types as T
from engine.events.request_state import PREEMPTED, WAITING, RequestState
from engine.events.rules import HANDLERS, ImpossibleEventError


class PoolState:
    """Mutable folded state; O(1) per block event (O(table) for a few request events)."""

    __slots__ = ("step", "block_size", "num_blocks", "ref", "hash", "block_tokens", "free",
                 "requests", "last_free")

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
        self.requests: dict[str, RequestState] = {}
        # (request_id, block, index) of the latest block_freed, so a cow_copy that
        # directly follows the release of its src is not counted twice. Set by the
        # block_freed rule, cleared by any other event and at the end of a step.
        self.last_free: tuple[str, int, int] | None = None

    # ---- construction ------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> PoolState:
        """Rebuild a PoolState from a snapshot dict (validated with ``check``)."""
        s = cls(int(snap["num_blocks"]), int(snap["block_size"]))
        s.step = int(snap.get("step", 0))
        for b in snap["blocks"]:
            i = b["id"]
            s.ref[i] = b["ref_count"]
            s.hash[i] = b.get("hash")
            tok = b.get("token_ids")
            s.block_tokens[i] = tuple(tok) if tok is not None else None
        s.free = OrderedDict.fromkeys(snap["free_queue"])
        for rid, r in snap["requests"].items():
            s.requests[rid] = RequestState(r["status"], list(r["block_table"]), r["num_tokens"],
                                           r["num_computed_tokens"], r.get("num_cached_tokens", 0),
                                           list(r.get("token_ids", ())), r.get("parent_id"),
                                           r.get("arrival_index", 0))
        s.check(statuses=False)  # may be a mid-step state (blocks before request_scheduled)
        return s

    def copy(self) -> PoolState:
        """An independent copy (no list or request record is shared)."""
        s = PoolState.__new__(PoolState)
        s.step, s.block_size, s.num_blocks = self.step, self.block_size, self.num_blocks
        s.ref, s.hash, s.block_tokens = list(self.ref), list(self.hash), list(self.block_tokens)
        s.free = OrderedDict(self.free)
        s.requests = {rid: r.copy() for rid, r in self.requests.items()}
        s.last_free = self.last_free
        return s

    # ---- folding -----------------------------------------------------------

    def apply_event(self, event: T.Event | dict[str, Any]) -> None:
        """Fold one event (typed or its dict form) into this state, in place."""
        if isinstance(event, dict):
            event = T.event_from_dict(event)
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise ImpossibleEventError(f"no reducer rule for event type {event.type!r}")
        self.step = event.step
        handler(self, event)
        if type(event) is not T.BlockFreed:
            self.last_free = None

    def apply_events(self, events: Iterable[T.Event | dict[str, Any]]) -> None:
        """Fold ``events`` in order, in place."""
        for e in events:
            self.apply_event(e)

    def apply_step(self, record: Any) -> None:
        """Fold a StepRecord's events; the state's step becomes the record's."""
        self.apply_events(record.events)
        self.step = record.step
        self.last_free = None  # a cow_copy never pairs with a release from an earlier step

    # ---- output ------------------------------------------------------------

    def block_fill(self) -> list[int]:
        """Filled slots per block, by the snapshot's definition."""
        bs = self.block_size
        fill = [bs if (self.ref[i] == 0 and self.hash[i] is not None) else 0
                for i in range(self.num_blocks)]
        for r in self.requests.values():
            c = r.num_computed_tokens
            for i, b in enumerate(r.table):
                if b is not None:
                    f = min(max(c - i * bs, 0), bs)
                    if f > fill[b]:
                        fill[b] = f
        return fill

    def to_snapshot(self) -> dict[str, Any]:
        """The snapshot dict (fresh lists; safe to hand out)."""
        for rid, r in self.requests.items():
            if None in r.table:
                raise ImpossibleEventError(f"request {rid!r}: a block was released from the "
                                           f"middle of its table with no cow_copy to refill it")
        fill = self.block_fill()
        return {
            "step": self.step,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "blocks": [{"id": i, "ref_count": self.ref[i], "hash": self.hash[i],
                        "num_tokens": fill[i],
                        "token_ids": list(t) if (t := self.block_tokens[i]) is not None else None}
                       for i in range(self.num_blocks)],
            "free_queue": list(self.free),
            "requests": {rid: {"status": r.status, "block_table": list(r.table),
                               "num_tokens": r.num_tokens,
                               "num_computed_tokens": r.num_computed_tokens,
                               "num_cached_tokens": r.num_cached_tokens,
                               "token_ids": list(r.token_ids), "parent_id": r.parent_id,
                               "arrival_index": r.arrival_index}
                         for rid, r in self.requests.items()},
        }

    def check(self, statuses: bool = True) -> None:
        """Assert invariants: refs = table occurrences, free queue = ref-0 blocks and
        (with ``statuses``, true between steps only) no waiting/preempted table."""
        counts = [0] * self.num_blocks
        for rid, r in self.requests.items():
            for b in r.table:
                if b is not None:
                    counts[b] += 1
            if statuses and r.status in (WAITING, PREEMPTED) and r.table:
                raise ImpossibleEventError(f"{r.status} request {rid!r} holds blocks {r.table}")
        if counts != self.ref:
            bad = [i for i in range(self.num_blocks) if counts[i] != self.ref[i]]
            raise ImpossibleEventError(f"ref counts disagree with block tables at blocks {bad}")
        free = {i for i in range(self.num_blocks) if self.ref[i] == 0}
        if free != set(self.free) or len(self.free) != len(free):
            raise ImpossibleEventError("free queue does not hold exactly the ref-0 blocks")

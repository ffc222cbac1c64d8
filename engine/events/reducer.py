"""The state reducer: folds protocol events into the pool snapshot.

One code path for live view and replay: the dashboard and ``snapshot_at`` fold
the same events with ``PoolState``. After every step the folded state must equal
``scheduler.snapshot()``; an event that cannot happen in the folded state (a
drift between engine and reducer) raises ``ImpossibleEventError`` at once.

Snapshot shape (JSON-able)::

    {"step", "block_size", "num_blocks",
     "blocks": [{"id", "ref_count", "hash", "num_tokens", "token_ids"}],  # by id
     "free_queue": [ids, head (reused next) first],
     "requests": {rid: {"status", "block_table", "num_tokens", "num_computed_tokens",
                        "num_cached_tokens", "token_ids", "parent_id", "arrival_index"}}}

Writer: ``PoolState`` is written only by ``apply_event``; ``apply``/``replay``
are pure wrappers over it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from engine.events import types as T

_WAITING, _RUNNING, _PREEMPTED = "waiting", "running", "preempted"


class ImpossibleEventError(ValueError):
    """An event does not fit the folded state: the engine and reducer drifted."""


class _Req:
    __slots__ = ("status", "table", "num_tokens", "num_computed_tokens", "num_cached_tokens",
                 "token_ids", "parent_id", "arrival_index")

    def __init__(self, status: str, table: list, num_tokens: int, num_computed_tokens: int,
                 num_cached_tokens: int, token_ids: list[int], parent_id: str | None,
                 arrival_index: int) -> None:
        self.status = status
        self.table = table  # physical ids; None marks a hole awaiting its cow_copy
        self.num_tokens = num_tokens
        self.num_computed_tokens = num_computed_tokens
        self.num_cached_tokens = num_cached_tokens
        self.token_ids = token_ids
        self.parent_id = parent_id
        self.arrival_index = arrival_index

    def copy(self) -> _Req:
        return _Req(self.status, list(self.table), self.num_tokens, self.num_computed_tokens,
                    self.num_cached_tokens, list(self.token_ids), self.parent_id,
                    self.arrival_index)


class PoolState:
    """Mutable folded state; O(1) per block event (O(table) for a few request events)."""

    __slots__ = ("step", "block_size", "num_blocks", "ref", "hash", "block_tokens", "free",
                 "requests", "_last_free")

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
        self.requests: dict[str, _Req] = {}
        # (request_id, block, index) of the latest block_freed, so a cow_copy that
        # directly follows the release of its src is not counted twice.
        self._last_free: tuple[str, int, int] | None = None

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
            s.requests[rid] = _Req(r["status"], list(r["block_table"]), r["num_tokens"],
                                   r["num_computed_tokens"], r.get("num_cached_tokens", 0),
                                   list(r.get("token_ids", ())), r.get("parent_id"),
                                   r.get("arrival_index", 0))
        s.check(statuses=False)  # may be a mid-step state (blocks before request_scheduled)
        return s

    def copy(self) -> PoolState:
        s = PoolState.__new__(PoolState)
        s.step, s.block_size, s.num_blocks = self.step, self.block_size, self.num_blocks
        s.ref, s.hash, s.block_tokens = list(self.ref), list(self.hash), list(self.block_tokens)
        s.free = OrderedDict(self.free)
        s.requests = {rid: r.copy() for rid, r in self.requests.items()}
        s._last_free = self._last_free
        return s

    # ---- folding -----------------------------------------------------------

    def apply_event(self, event: T.Event | dict[str, Any]) -> None:
        """Fold one event (typed or its dict form) into this state, in place."""
        if isinstance(event, dict):
            event = T.event_from_dict(event)
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise ImpossibleEventError(f"no reducer rule for event type {event.type!r}")
        self.step = event.step
        handler(self, event)
        if type(event) is not T.BlockFreed:
            self._last_free = None

    def apply_events(self, events: Iterable[T.Event | dict[str, Any]]) -> None:
        for e in events:
            self.apply_event(e)

    def apply_step(self, record: Any) -> None:
        """Fold a StepRecord's events; the state's step becomes the record's."""
        self.apply_events(record.events)
        self.step = record.step
        self._last_free = None  # a cow_copy never pairs with a release from an earlier step

    # ---- helpers shared by handlers ----------------------------------------

    def _req(self, e: T.Event, rid: str) -> _Req:
        r = self.requests.get(rid)
        if r is None:
            raise ImpossibleEventError(f"{e.type} at step {e.step}: unknown request {rid!r}")
        return r

    def _block(self, e: T.Event, b: int) -> int:
        if not isinstance(b, int) or not 0 <= b < self.num_blocks:
            raise ImpossibleEventError(f"{e.type} at step {e.step}: no block {b!r} "
                                       f"(pool has {self.num_blocks})")
        return b

    def _take_fresh(self, e: T.Event, b: int) -> None:
        """A free, hashless block gets its first reference (allocation or cow dst)."""
        self._block(e, b)
        if self.ref[b] != 0:
            raise ImpossibleEventError(f"{e.type} at step {e.step}: block {b} has ref_count "
                                       f"{self.ref[b]}, expected a free block")
        if self.hash[b] is not None:
            raise ImpossibleEventError(f"{e.type} at step {e.step}: block {b} still holds hash "
                                       f"{self.hash[b][:12]}; a block_evicted must come first")
        del self.free[b]
        self.ref[b] = 1

    def _touch(self, e: T.Event, b: int) -> None:
        """Add a reference to an existing block (hit or fork)."""
        self._block(e, b)
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

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
            if statuses and r.status in (_WAITING, _PREEMPTED) and r.table:
                raise ImpossibleEventError(f"{r.status} request {rid!r} holds blocks {r.table}")
        if counts != self.ref:
            bad = [i for i in range(self.num_blocks) if counts[i] != self.ref[i]]
            raise ImpossibleEventError(f"ref counts disagree with block tables at blocks {bad}")
        free = {i for i in range(self.num_blocks) if self.ref[i] == 0}
        if free != set(self.free) or len(self.free) != len(free):
            raise ImpossibleEventError("free queue does not hold exactly the ref-0 blocks")


# ---- event rules (types.py states the semantics) ----------------------------

def _allocated(s: PoolState, e: T.BlockAllocated) -> None:
    r = s._req(e, e.request_id)
    if e.logical_index != len(r.table):
        raise ImpossibleEventError(f"block_allocated at step {e.step}: {e.request_id!r} has "
                                   f"{len(r.table)} blocks, event appends at {e.logical_index}")
    s._take_fresh(e, e.block)
    r.table.append(e.block)


def _freed(s: PoolState, e: T.BlockFreed) -> None:
    b = s._block(e, e.block)
    r = s._req(e, e.request_id)
    if s.ref[b] - 1 != e.ref_count or s.ref[b] == 0:
        raise ImpossibleEventError(f"block_freed at step {e.step}: block {b} has ref_count "
                                   f"{s.ref[b]}, event says it drops to {e.ref_count}")
    if r.table and r.table[-1] == b:  # the usual case: tables are freed tail first
        idx = len(r.table) - 1
        r.table.pop()
    elif b in r.table:
        idx = r.table.index(b)
        r.table[idx] = None  # keep later indices stable; a cow_copy refills it
    else:
        raise ImpossibleEventError(f"block_freed at step {e.step}: block {b} is not in "
                                   f"{e.request_id!r}'s table {r.table}")
    s.ref[b] -= 1
    if s.ref[b] == 0:
        s.free[b] = None
        if s.hash[b] is None:
            s.free.move_to_end(b, last=False)  # hashless: reused first
    s._last_free = (e.request_id, b, idx)


def _cached(s: PoolState, e: T.BlockCached) -> None:
    b = s._block(e, e.block)
    if s.ref[b] == 0:
        raise ImpossibleEventError(f"block_cached at step {e.step}: block {b} is free")
    if s.hash[b] is not None:
        raise ImpossibleEventError(f"block_cached at step {e.step}: block {b} already holds a hash")
    s.hash[b] = e.hash
    s.block_tokens[b] = tuple(e.token_ids)


def _evicted(s: PoolState, e: T.BlockEvicted) -> None:
    # In-use blocks may lose their hash too (a prefix-cache reset forgets every
    # hash); the block keeps its place in the free queue either way.
    b = s._block(e, e.block)
    if s.hash[b] != e.hash:
        raise ImpossibleEventError(f"block_evicted at step {e.step}: block {b} holds hash "
                                   f"{s.hash[b]!r}, event evicts {e.hash!r}")
    s.hash[b] = None
    s.block_tokens[b] = None


def _prefix_hit(s: PoolState, e: T.PrefixHit) -> None:
    r = s._req(e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"prefix_hit at step {e.step}: {e.request_id!r} already "
                                   f"holds blocks {r.table}")
    for b in e.blocks:
        s._block(e, b)
        if s.hash[b] is None:
            raise ImpossibleEventError(f"prefix_hit at step {e.step}: block {b} is not cached")
    for b in e.blocks:
        s._touch(e, b)
    r.table.extend(e.blocks)
    r.num_cached_tokens = r.num_computed_tokens = e.num_tokens


def _prefix_lookup(s: PoolState, e: T.PrefixLookup) -> None:
    # The lookup is recorded at admission, before its prefix_hit (if any).
    r = s._req(e, e.request_id)
    r.num_cached_tokens = r.num_computed_tokens = e.num_hit_tokens


def _cow(s: PoolState, e: T.CowCopy) -> None:
    r = s._req(e, e.request_id)
    i, src = e.logical_index, e.src
    s._block(e, src)
    if i < len(r.table) and r.table[i] == src:
        if s.ref[src] < 2:
            raise ImpossibleEventError(f"cow_copy at step {e.step}: src block {src} has "
                                       f"ref_count {s.ref[src]}, copy-on-write needs > 1")
        s.ref[src] -= 1  # the request's reference moves from src to dst
    elif s._last_free != (e.request_id, src, i):
        raise ImpossibleEventError(f"cow_copy at step {e.step}: {e.request_id!r} does not hold "
                                   f"src block {src} at logical index {i} ({r.table})")
    # else: the engine released src with a block_freed just before; nothing to drop.
    s._take_fresh(e, e.dst)
    if i == len(r.table):
        r.table.append(e.dst)
    else:
        r.table[i] = e.dst


def _cache_reset(s: PoolState, e: T.PrefixCacheReset) -> None:
    stale = [b for b in s.free if s.hash[b] is not None]
    if stale:
        raise ImpossibleEventError(f"prefix_cache_reset at step {e.step}: free blocks {stale} "
                                   f"still hold hashes (block_evicted must precede the reset)")


def _arrived(s: PoolState, e: T.RequestArrived) -> None:
    if e.request_id in s.requests:
        raise ImpossibleEventError(f"request_arrived at step {e.step}: {e.request_id!r} exists")
    s.requests[e.request_id] = _Req(_WAITING, [], e.num_prompt_tokens, 0, 0,
                                    list(e.prompt_token_ids), None, e.arrival_index)


def _forked(s: PoolState, e: T.RequestForked) -> None:
    if e.request_id in s.requests:
        raise ImpossibleEventError(f"request_forked at step {e.step}: {e.request_id!r} exists")
    for b in e.blocks:
        s._touch(e, b)
    # A table implies running (waiting/preempted requests hold no blocks); the child
    # inherits its parent's prefix-cache credit, as the engine's Request.fork does.
    parent = s.requests.get(e.parent_id)
    s.requests[e.request_id] = _Req(_RUNNING if e.blocks else _WAITING, list(e.blocks),
                                    e.num_tokens, e.num_computed_tokens,
                                    parent.num_cached_tokens if parent else 0,
                                    list(e.token_ids), e.parent_id, e.arrival_index)


def _scheduled(s: PoolState, e: T.RequestScheduled) -> None:
    s._req(e, e.request_id).status = _RUNNING


def _progress(s: PoolState, e: T.RequestProgress) -> None:
    r = s._req(e, e.request_id)
    r.num_tokens, r.num_computed_tokens = e.num_tokens, e.num_computed_tokens
    r.token_ids.extend(e.new_token_ids)


def _preempted(s: PoolState, e: T.RequestPreempted) -> None:
    r = s._req(e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"request_preempted at step {e.step}: {e.request_id!r} still "
                                   f"holds blocks {r.table} (block_freed events must precede)")
    r.status, r.num_computed_tokens = _PREEMPTED, 0


def _finished(s: PoolState, e: T.RequestFinished) -> None:
    r = s._req(e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"request_finished at step {e.step}: {e.request_id!r} still "
                                   f"holds blocks {r.table} (block_freed events must precede)")
    del s.requests[e.request_id]


_HANDLERS = {
    T.BlockAllocated: _allocated, T.BlockFreed: _freed, T.BlockCached: _cached,
    T.BlockEvicted: _evicted, T.PrefixHit: _prefix_hit, T.PrefixLookup: _prefix_lookup,
    T.CowCopy: _cow, T.PrefixCacheReset: _cache_reset, T.RequestArrived: _arrived,
    T.RequestForked: _forked, T.RequestScheduled: _scheduled, T.RequestProgress: _progress,
    T.RequestPreempted: _preempted, T.RequestFinished: _finished,
}


# ---- pure API -------------------------------------------------------------

def empty_state(num_blocks: int, block_size: int) -> dict[str, Any]:
    """Snapshot of an empty pool: all blocks free, hashless, queued in id order."""
    return PoolState(num_blocks, block_size).to_snapshot()


def apply(state: dict[str, Any], event: T.Event | dict[str, Any]) -> dict[str, Any]:
    """Pure: the snapshot after ``event``; ``state`` is not mutated. O(state) per call,
    so fold many events with ``replay`` or a ``PoolState``."""
    s = PoolState.from_snapshot(state)
    s.apply_event(event)
    return s.to_snapshot()


def replay(snapshot_or_empty: dict[str, Any], events: Iterable[T.Event | dict[str, Any]],
           step: int | None = None) -> dict[str, Any]:
    """Pure: fold ``events`` onto a snapshot; ``step`` overrides the result's step."""
    s = PoolState.from_snapshot(snapshot_or_empty)
    s.apply_events(events)
    if step is not None:
        s.step = step
    return s.to_snapshot()

"""Protocol v1 event types: every block and request state change the core makes.

Plain Python (no torch). Each event is a frozen dataclass with a ``type`` tag and
the engine ``step`` it happened in; ``to_dict``/``event_from_dict`` give the JSON
round trip. Events are atomic operations on the pool, so a pure reducer can
rebuild the engine's exact state from them (see ``engine.events.reducer``).

Semantics the reducer relies on (writer: ``engine.core``):
- ``block_allocated``: the block leaves the free queue (wherever it sits), gets
  ref_count 1 and is appended to ``request_id``'s table at ``logical_index``. If
  it held a cached hash, a ``block_evicted`` for it comes first.
- ``block_freed``: ``request_id`` dropped one reference; ``ref_count`` is the new
  count. At 0 the block joins the free queue: at the tail if it still has a hash
  (evictable, LRU), at the head if it has none (reused first).
- ``block_cached``: a full block got its chained hash; it stays hittable until
  evicted. ``token_ids`` are the block's tokens.
- ``block_evicted``: the hash is dropped (block reused, or prefix cache reset).
- ``prefix_hit``: ``blocks`` become the first entries of the request's table;
  each gains a reference (leaving the free queue if its count was 0).
- ``request_forked``: a copy-on-write fork; the child's table is ``blocks`` (the
  parent's, including the partial last block), each gaining a reference.
- ``cow_copy``: before writing into shared ``src`` (ref > 1) at
  ``logical_index``, the request got fresh ``dst`` from the free queue (ref 1)
  in place of ``src``. The request's reference to ``src`` is dropped by the
  ``block_freed`` (src, new ref >= 1) that comes right before this event. The
  runner copies src → dst before the step's forward.
- ``request_progress``: absolute ``num_tokens``/``num_computed_tokens`` after the
  step's update, plus the tokens appended this step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

PROTOCOL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Event:
    type: ClassVar[str] = "event"
    step: int

    def to_dict(self) -> dict[str, Any]:
        d = {"type": self.type}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d


# ---- block events -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BlockAllocated(Event):
    type: ClassVar[str] = "block_allocated"
    block: int
    request_id: str
    logical_index: int


@dataclass(frozen=True, slots=True)
class BlockFreed(Event):
    type: ClassVar[str] = "block_freed"
    block: int
    request_id: str
    ref_count: int


@dataclass(frozen=True, slots=True)
class BlockCached(Event):
    type: ClassVar[str] = "block_cached"
    block: int
    hash: str
    parent_hash: str | None
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlockEvicted(Event):
    type: ClassVar[str] = "block_evicted"
    block: int
    hash: str


@dataclass(frozen=True, slots=True)
class PrefixHit(Event):
    type: ClassVar[str] = "prefix_hit"
    request_id: str
    blocks: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixLookup(Event):
    """One prefix-cache lookup at admission, with misses split by cause (tokens).

    ``num_query_tokens == num_hit_tokens + miss_cold + miss_evicted + miss_partial
    + miss_disabled`` always holds.
    """

    type: ClassVar[str] = "prefix_lookup"
    request_id: str
    num_query_tokens: int
    num_hit_tokens: int
    miss_cold: int
    miss_evicted: int
    miss_partial: int
    miss_disabled: int


@dataclass(frozen=True, slots=True)
class CowCopy(Event):
    type: ClassVar[str] = "cow_copy"
    request_id: str
    src: int
    dst: int
    logical_index: int


@dataclass(frozen=True, slots=True)
class PrefixCacheReset(Event):
    """Every cached block, free or in use, lost its hash (block_evicted events precede it)."""

    type: ClassVar[str] = "prefix_cache_reset"


# ---- request events ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RequestArrived(Event):
    type: ClassVar[str] = "request_arrived"
    request_id: str
    num_prompt_tokens: int
    prompt_token_ids: tuple[int, ...] = ()
    arrival_index: int = 0


@dataclass(frozen=True, slots=True)
class RequestForked(Event):
    type: ClassVar[str] = "request_forked"
    request_id: str
    parent_id: str
    blocks: tuple[int, ...]
    num_tokens: int
    num_computed_tokens: int
    token_ids: tuple[int, ...] = ()
    arrival_index: int = 0


@dataclass(frozen=True, slots=True)
class RequestScheduled(Event):
    type: ClassVar[str] = "request_scheduled"
    request_id: str
    num_tokens: int
    phase: str  # "prefill" | "decode"
    num_computed_tokens: int = 0  # before this step's tokens


@dataclass(frozen=True, slots=True)
class RequestProgress(Event):
    type: ClassVar[str] = "request_progress"
    request_id: str
    num_tokens: int
    num_computed_tokens: int
    new_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestPreempted(Event):
    type: ClassVar[str] = "request_preempted"
    request_id: str


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    type: ClassVar[str] = "request_finished"
    request_id: str
    reason: str  # "length" | "stop" | "abort"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        BlockAllocated, BlockFreed, BlockCached, BlockEvicted, PrefixHit, PrefixLookup,
        CowCopy, PrefixCacheReset, RequestArrived, RequestForked, RequestScheduled,
        RequestProgress, RequestPreempted, RequestFinished,
    )
}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_dict``; raises ValueError on an unknown type."""
    try:
        cls = EVENT_TYPES[d["type"]]
    except KeyError as exc:
        raise ValueError(f"unknown event type {d.get('type')!r}") from exc
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            v = d[f.name]
            kwargs[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**kwargs)

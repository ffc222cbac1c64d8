"""Protocol v2 event types: every block and request state change the core makes, and
the hash-only events of an attached foreign engine.

(Past 300 lines because this is the one registry of every event type on the wire,
kvscope's own and attach mode's; the rules that fold them live elsewhere.)

Plain Python (no torch). Each event is a frozen dataclass with a ``type`` tag and
the engine ``step`` it happened in; ``to_dict``/``event_from_dict`` give the JSON
round trip. Events are atomic operations on the pool, so a pure reducer can
rebuild the engine's exact state from them (see ``engine.events.folds.reducer``), and
each carries its own cause: no reader has to guess from neighbouring events.

Semantics the reducer relies on (writer: ``engine.core``):
- ``block_allocated``: the block leaves the free queue (wherever it sits), gets
  ref_count 1 and is appended to ``request_id``'s table at ``logical_index``. If
  it held a cached hash, a ``block_evicted`` (reason ``reuse``) for it comes first.
- ``block_freed``: ``request_id`` dropped its reference to the LAST block of its
  table (tables are released tail first); ``ref_count`` is the new count. At 0 the
  block joins the free queue: at the tail if it still has a hash (evictable,
  LRU), at the head if it has none (reused first).
- ``block_cached``: a full block got its chained hash; it stays hittable until
  evicted. ``token_ids`` are the block's tokens.
- ``block_evicted``: the block's hash is dropped; the block keeps its place (free
  queue or tables). ``reason`` says why (``EvictionReason``): ``reuse`` (an LRU
  eviction: the free block is being allocated; vLLM's BlockRemoved), ``reset``
  (a prefix-cache reset dropped every hash; a ``prefix_cache_reset`` follows the
  step's reset evictions; vLLM's AllBlocksCleared) or ``rollback`` (the step's
  forward failed, so hashes given at schedule time for K/V it never wrote are
  withdrawn).
- ``prefix_lookup``: one lookup at admission (see the class).
- ``prefix_hit``: ``blocks`` become the first entries of the request's table;
  each gains a reference (leaving the free queue if its count was 0).
- ``request_forked``: a copy-on-write fork; the child's table is ``blocks`` (the
  parent's, including the partial last block), each gaining a reference.
- ``cow_copy``: self-contained. Before writing into shared ``src`` (ref > 1) at
  ``logical_index``, the request got fresh ``dst`` from the free queue (ref 1; a
  ``block_evicted``, reason ``reuse``, comes first if dst held a hash) in its
  table's place; its reference to ``src`` is dropped, leaving
  ``src_ref_count`` (>= 1, so src never becomes free here). No ``block_freed``
  accompanies it. The runner copies src → dst before the step's forward.
- ``request_arrived``: a waiting request with no blocks. ``parent_id`` is set for
  sample k > 0 of an ``n > 1`` request entered as its own request (vLLM v1's parallel
  sampling, ``n_sharing="prefix_cache"``): it shares blocks only through prefix hits.
- ``request_scheduled``: ``phase`` is a ``ScheduledPhase``.
- ``request_progress``: absolute ``num_tokens``/``num_computed_tokens`` after the
  step's update, plus the tokens appended this step.

Hash-only events (writer: ``engine.attach``; folded by ``engine.events.folds.hash_cache_state``)
are what ``kvscope attach`` records from a vLLM / SGLang / kvscope KV event stream.
They carry no block ids, ref counts or request ids, because the stream has none.
Each names the ``pod`` it came from; hashes are strings (``engine.events.schema.hash_key``).
- ``kv_block_stored``: the chain ``block_hashes`` became cached; the first one's
  parent is ``parent_hash`` (None: a root), each next one's parent is the one
  before it; ``token_ids`` are the blocks' tokens, ``block_size`` per block. A hash
  already cached on that pod and medium is stored again when the engine recomputed
  it into a second physical block (vLLM v1 keeps both): the fold counts its copies.
  A placeholder (no ``token_ids``, ``block_size`` 0) says a hash is held on a tier
  without its tokens. The source's ``group_idx``, ``kv_cache_spec_kind``,
  ``kv_cache_spec_sliding_window``, ``extra_keys`` (one entry per block, arrays),
  ``locality`` and ``ownership`` are kept as sent (None: not sent).
- ``kv_block_removed``: one copy of each of those hashes left the pod's cache
  (evicted). A hash the fold does not hold (stored before the attach, or lost in a
  hole) is counted.
- ``kv_all_cleared``: the pod's cache is empty (a prefix-cache reset).
- ``kv_gap``: the pod's batches ``first_seq..last_seq`` of segment ``segment``
  never arrived and replay could not return them; the pod's fold may miss stores
  and removals from then on (it says so).
- ``kv_segment``: the pod's stream (re)starts at ``first_seq`` of a new segment:
  the publisher restarted (its seq went back), so its cache starts empty.
``ts`` of stored/removed/cleared is the source's batch time (the source's clock).

Version 2 (this one) added ``block_evicted.reason``, ``cow_copy.src_ref_count``
(no ``block_freed`` before it any more) and ``prefix_lookup.resumed``;
``engine.events.schema.legacy`` upgrades version 1 step bodies on decode.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.events.schema.json_text import compact, compact_bytes

PROTOCOL_VERSION = 2


class ScheduledPhase(enum.StrEnum):
    """What a step's tokens of one request are: prompt (or recompute) chunk, or one decode."""

    PREFILL = "prefill"
    DECODE = "decode"


class EvictionReason(enum.StrEnum):
    """Why a block lost its hash (``block_evicted.reason``); see the module docstring."""

    REUSE = "reuse"
    RESET = "reset"
    ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class Event:
    type: ClassVar[str] = "event"
    step: int

    def to_dict(self) -> dict[str, Any]:
        d = {"type": self.type}
        for name in _field_names(type(self)):
            v = getattr(self, name)
            if isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, enum.Enum):
                v = v.value  # a plain string on the wire
            d[name] = v
        return d

    def to_json(self) -> str:
        """``json_text.compact(self.to_dict())``, written without the dict: msgspec writes
        a dataclass's fields in order, tuples as arrays and enums as their values, as
        ``to_dict`` does; the type goes first."""
        b = compact_bytes(self)
        if b is None:
            return compact(self.to_dict())
        return '{"type":"' + self.type + '",' + b[1:].decode("ascii")  # b: {"step":...}


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """An event class's field names in order (``dataclasses.fields`` builds them anew on
    every call; an event is written once per reader)."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


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
    reason: EvictionReason = EvictionReason.REUSE

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", EvictionReason(self.reason))


@dataclass(frozen=True, slots=True)
class PrefixHit(Event):
    type: ClassVar[str] = "prefix_hit"
    request_id: str
    blocks: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixLookup(Event):
    """One prefix-cache lookup at admission, with misses split by cause (tokens).

    ``num_query_tokens`` is the request's token count at the lookup;
    ``num_query_tokens == num_hit_tokens + miss_cold + miss_evicted + miss_partial
    + miss_disabled`` always holds. With prefix caching off nothing is looked up:
    every token is ``miss_disabled`` (and nothing else is). ``resumed``: the request
    was preempted before (vLLM's ``request.num_preemptions > 0``), so this lookup
    re-finds what it computed itself and is counted apart from first admissions.
    """

    type: ClassVar[str] = "prefix_lookup"
    request_id: str
    num_query_tokens: int
    num_hit_tokens: int
    miss_cold: int
    miss_evicted: int
    miss_partial: int
    miss_disabled: int
    resumed: bool = False

    def __post_init__(self) -> None:
        parts = (self.num_hit_tokens, self.miss_cold, self.miss_evicted, self.miss_partial,
                 self.miss_disabled)
        if min(parts) < 0 or sum(parts) != self.num_query_tokens:
            raise ValueError(f"prefix_lookup of {self.request_id!r}: hits and misses {parts} do "
                             f"not add up to {self.num_query_tokens} query tokens")
        if self.miss_disabled not in (0, self.num_query_tokens):
            raise ValueError(f"prefix_lookup of {self.request_id!r}: with prefix caching off "
                             f"every token is a disabled miss, got {self.miss_disabled} of "
                             f"{self.num_query_tokens}")

    @property
    def caching_enabled(self) -> bool:
        """False when prefix caching was off: then nothing was queried (vLLM counts nothing)."""
        return self.miss_disabled == 0


@dataclass(frozen=True, slots=True)
class CowCopy(Event):
    type: ClassVar[str] = "cow_copy"
    request_id: str
    src: int
    dst: int
    logical_index: int
    src_ref_count: int  # src's count after this request's reference moved to dst (>= 1)


@dataclass(frozen=True, slots=True)
class PrefixCacheReset(Event):
    """Every cached block, free or in use, lost its hash (its block_evicted events,
    reason ``reset``, precede this one in the same step)."""

    type: ClassVar[str] = "prefix_cache_reset"


# ---- request events ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RequestArrived(Event):
    type: ClassVar[str] = "request_arrived"
    request_id: str
    num_prompt_tokens: int
    prompt_token_ids: tuple[int, ...] = ()
    arrival_index: int = 0
    parent_id: str | None = None  # a sample k > 0 entered as its own request (n_sharing="prefix_cache")


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
    phase: ScheduledPhase
    num_computed_tokens: int = 0  # before this step's tokens

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", ScheduledPhase(self.phase))


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


# ---- hash-only events (attach mode) -----------------------------------------

@dataclass(frozen=True, slots=True)
class KVBlockStored(Event):
    type: ClassVar[str] = "kv_block_stored"
    pod: str
    block_hashes: tuple[str, ...]
    parent_hash: str | None
    token_ids: tuple[int, ...]  # len(block_hashes) * block_size, block after block
    block_size: int
    ts: float
    medium: str | None = None
    lora_name: str | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    extra_keys: tuple[list | None, ...] | None = None
    locality: str | None = None
    ownership: str | None = None

    @property
    def is_placeholder(self) -> bool:
        """A hash-only store: no tokens, ``block_size`` 0."""
        return self.block_size == 0 and not self.token_ids

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.block_hashes) * self.block_size:
            raise ValueError(f"kv_block_stored on {self.pod!r}: {len(self.block_hashes)} blocks of "
                             f"{self.block_size} tokens need {len(self.block_hashes) * self.block_size} "
                             f"token ids, got {len(self.token_ids)}")

    def block_tokens(self, i: int) -> tuple[int, ...]:
        """The tokens of block ``i`` of this chain."""
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]


@dataclass(frozen=True, slots=True)
class KVBlockRemoved(Event):
    type: ClassVar[str] = "kv_block_removed"
    pod: str
    block_hashes: tuple[str, ...]
    ts: float
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(frozen=True, slots=True)
class KVAllCleared(Event):
    type: ClassVar[str] = "kv_all_cleared"
    pod: str
    ts: float


@dataclass(frozen=True, slots=True)
class KVGap(Event):
    type: ClassVar[str] = "kv_gap"
    pod: str
    segment: int
    first_seq: int
    last_seq: int
    reason: str  # e.g. "not in the replay buffer", "no replay endpoint", "undecodable: ..."

    @property
    def num_batches(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass(frozen=True, slots=True)
class KVSegment(Event):
    type: ClassVar[str] = "kv_segment"
    pod: str
    segment: int
    first_seq: int
    reason: str  # "attach" (the first batch seen) | "restart" (the seq went back)


KV_EVENT_TYPES = (KVBlockStored, KVBlockRemoved, KVAllCleared, KVGap, KVSegment)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        BlockAllocated, BlockFreed, BlockCached, BlockEvicted, PrefixHit, PrefixLookup,
        CowCopy, PrefixCacheReset, RequestArrived, RequestForked, RequestScheduled,
        RequestProgress, RequestPreempted, RequestFinished, *KV_EVENT_TYPES,
    )
}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_dict``; raises ValueError on an unknown type, a missing
    field or a field value the event rejects (a v1 body goes through
    ``engine.events.schema.legacy`` first; ``StepRecord`` does that)."""
    try:
        cls = EVENT_TYPES[d["type"]]
    except KeyError as exc:
        raise ValueError(f"unknown event type {d.get('type')!r}") from exc
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            v = d[f.name]
            kwargs[f.name] = tuple(v) if isinstance(v, list) else v
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ValueError(f"bad {cls.type} event {d!r}: {exc}") from exc

"""``HashCacheState``: the hash-only reducer, folding ``kv_*`` events into each pod's cache.

The attach-mode twin of ``PoolState``: the live client, the recorder's replay and the
dashboard fold an attached run with it, and ``to_snapshot`` gives a
``HashCacheSnapshot``. The rules (semantics in ``engine.events.schema.types``):

- ``kv_block_stored``: each hash not yet cached on (pod, medium) is added with its
  parent (the previous hash of the chain; the first one's is ``parent_hash``) and its
  tokens. One already cached gains a copy: vLLM v1 keeps a second physical block under
  the same hash when a request recomputes a cached block (a prompt's last full block,
  never hit, or a decode filling a block another request already cached) and sends
  ``BlockStored`` for it again; that is a recomputation, not a reuse. The stored
  chain's cached ancestors are accessed (``engine.events.metrics.residency`` says what
  counts as reuse). A placeholder store (no tokens, ``block_size`` 0: vLLM's offloading
  connector) adds the hash without tokens and leaves the pod's ``block_size`` alone.
- ``kv_block_removed``: each hash loses one copy on (pod, medium), and leaves it with
  its last; with no medium, whichever medium holds it. A hash not held is counted in
  ``unknown_removals``, never an error: a stream joined late or with a hole can remove
  what this fold never saw. Children of a removed block stay (they become roots of
  their own subtree).
- ``kv_all_cleared``: the pod's cache is empty.
- ``kv_gap``: the hole is noted; the cache is kept (it may be incomplete from here).
- ``kv_segment``: a ``restart`` empties the pod's cache (a restarted engine starts
  cold); the segment number is kept.

Unlike the pool reducer nothing here is impossible: a foreign stream is taken as
it is and its oddities are counted.

Writer: ``apply_event`` (construction aside: ``from_snapshot`` and ``copy``).
"""

from __future__ import annotations

from typing import Any

from engine.events.folds.fold import Fold
from engine.events.folds.hash_cache_snapshot import (
    CachedBlockView, HashCacheSnapshot, PodCacheView, StreamHole, StreamSegment,
)
from engine.events.metrics.residency import ResidencyLog
from engine.events.schema.types import (
    Event, KVAllCleared, KVBlockRemoved, KVBlockStored, KVGap, KVSegment, event_from_dict,
)

_Key = tuple[str | None, str]  # (medium, hash)


class _Block:
    __slots__ = ("hash", "parent", "token_ids", "medium", "lora_name", "stored_step",
                 "stored_ts", "last_access_ts", "last_access_step", "reuses", "copies")

    def __init__(self, v: CachedBlockView) -> None:
        self.hash, self.parent, self.token_ids, self.medium = v.hash, v.parent, v.token_ids, v.medium
        self.lora_name, self.stored_step, self.stored_ts = v.lora_name, v.stored_step, v.stored_ts
        self.last_access_ts, self.reuses, self.copies = v.last_access_ts, v.reuses, v.copies
        self.last_access_step = v.stored_step

    def view(self) -> CachedBlockView:
        return CachedBlockView(self.hash, self.parent, self.token_ids, self.medium, self.stored_step,
                               self.stored_ts, self.last_access_ts, self.reuses, self.lora_name,
                               self.copies)

    def copy(self) -> _Block:
        b = _Block.__new__(_Block)
        for name in _Block.__slots__:
            setattr(b, name, getattr(self, name))
        return b


class _Pod:
    __slots__ = ("name", "segment", "block_size", "last_ts", "blocks", "children", "mediums",
                 "holes", "segments", "stored_blocks", "removed_blocks", "unknown_removals",
                 "clears")

    def __init__(self, name: str) -> None:
        self.name = name
        self.segment = 0
        self.block_size: int | None = None
        self.last_ts: float | None = None
        self.blocks: dict[_Key, _Block] = {}
        self.children: dict[_Key, set[str]] = {}  # (medium, parent hash) -> cached child hashes
        self.mediums: set[str | None] = set()  # every medium a block was stored under
        self.holes: list[StreamHole] = []
        self.segments: list[StreamSegment] = []
        self.stored_blocks = self.removed_blocks = self.unknown_removals = self.clears = 0

    def add(self, b: _Block) -> None:
        self.blocks[(b.medium, b.hash)] = b
        self.mediums.add(b.medium)
        if b.parent is not None:
            self.children.setdefault((b.medium, b.parent), set()).add(b.hash)

    def drop(self, key: _Key) -> _Block:
        b = self.blocks.pop(key)
        if b.parent is not None:
            kids = self.children.get((b.medium, b.parent))
            if kids is not None:
                kids.discard(b.hash)
                if not kids:
                    del self.children[(b.medium, b.parent)]
        return b

    def clear(self) -> None:
        self.blocks.clear()
        self.children.clear()

    def view(self) -> PodCacheView:
        return PodCacheView(self.name, self.segment, self.block_size, self.last_ts,
                            tuple(b.view() for b in self.blocks.values()), tuple(self.holes),
                            tuple(self.segments), self.stored_blocks, self.removed_blocks,
                            self.unknown_removals, self.clears)

    def copy(self) -> _Pod:
        p = _Pod(self.name)
        p.segment, p.block_size, p.last_ts = self.segment, self.block_size, self.last_ts
        p.blocks = {k: b.copy() for k, b in self.blocks.items()}
        p.children = {k: set(v) for k, v in self.children.items()}
        p.mediums = set(self.mediums)
        p.holes, p.segments = list(self.holes), list(self.segments)
        p.stored_blocks, p.removed_blocks = self.stored_blocks, self.removed_blocks
        p.unknown_removals, p.clears = self.unknown_removals, self.clears
        return p


class HashCacheState(Fold):
    """Mutable folded state of an attached run; O(blocks of the event) per event, plus
    O(depth) for the ancestors a store touches."""

    __slots__ = ("step", "pods", "residency")

    def __init__(self, residency: ResidencyLog | None = None) -> None:
        self.step = 0
        self.pods: dict[str, _Pod] = {}
        self.residency = residency  # collects lifetimes etc. when given

    # ---- construction ------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snap: HashCacheSnapshot | dict[str, Any]) -> HashCacheState:
        if isinstance(snap, dict):
            snap = HashCacheSnapshot.from_dict(snap)
        s = cls()
        s.step = snap.step
        for name, view in snap.pods.items():
            p = s._pod(name)
            p.segment, p.block_size, p.last_ts = view.segment, view.block_size, view.last_ts
            for b in view.blocks:
                p.add(_Block(b))
            p.holes, p.segments = list(view.holes), list(view.segments)
            p.stored_blocks, p.removed_blocks = view.stored_blocks, view.removed_blocks
            p.unknown_removals, p.clears = view.unknown_removals, view.clears
        return s

    def copy(self) -> HashCacheState:
        """An independent copy (the residency log is not carried: it belongs to one fold)."""
        s = HashCacheState()
        s.step = self.step
        s.pods = {name: p.copy() for name, p in self.pods.items()}
        return s

    # ---- folding -----------------------------------------------------------

    def apply_event(self, event: Event | dict[str, Any]) -> None:
        if isinstance(event, dict):
            event = event_from_dict(event)
        self.step = event.step
        if isinstance(event, KVBlockStored):
            self._stored(event)
        elif isinstance(event, KVBlockRemoved):
            self._removed(event)
        elif isinstance(event, KVAllCleared):
            p = self._pod(event.pod)
            p.clear()
            p.clears += 1
            p.last_ts = _later(p.last_ts, event.ts)
            if self.residency is not None:
                self.residency.cleared(event.pod)
        elif isinstance(event, KVGap):
            self._pod(event.pod).holes.append(StreamHole(event.step, event.segment, event.first_seq,
                                                         event.last_seq, event.reason))
        elif isinstance(event, KVSegment):
            p = self._pod(event.pod)
            if event.reason == "restart":
                p.clear()
                if self.residency is not None:
                    self.residency.cleared(event.pod)
            p.segment = event.segment
            p.segments.append(StreamSegment(event.step, event.segment, event.first_seq, event.reason))
        else:
            raise ValueError(f"an attached run holds kv_* events only, got {event.type!r}")


    def _pod(self, name: str) -> _Pod:
        p = self.pods.get(name)
        if p is None:
            p = self.pods[name] = _Pod(name)
        return p

    def _stored(self, e: KVBlockStored) -> None:
        p = self._pod(e.pod)
        p.last_ts = _later(p.last_ts, e.ts)
        if not e.is_placeholder:
            p.block_size = e.block_size
        log = self.residency
        if e.parent_hash is not None and e.block_hashes:
            siblings = p.children.get((e.medium, e.parent_hash), ())
            branch = any(h != e.block_hashes[0] for h in siblings)
            self._touch_ancestors(p, e.medium, e.parent_hash, e, branch)
        parent = e.parent_hash
        for i, h in enumerate(e.block_hashes):
            b = p.blocks.get((e.medium, h))
            if b is not None:  # stored again while cached: a recomputed second copy
                b.copies += 1
                b.last_access_ts, b.last_access_step = e.ts, e.step
            else:
                p.add(_Block(CachedBlockView(h, parent, e.block_tokens(i), e.medium, e.step, e.ts,
                                             e.ts, 0, e.lora_name)))
                p.stored_blocks += 1
                if log is not None:
                    log.stored(p.name, e.medium, h, e.ts)
            parent = h

    def _touch_ancestors(self, p: _Pod, medium: str | None, start: str, e: KVBlockStored,
                         reuse: bool) -> None:
        """Walk up from ``start`` while cached: each ancestor was held by the storing request."""
        key: _Key = (medium, start)
        for _ in range(len(p.blocks)):  # bounded: a malformed stream may chain in a loop
            b = p.blocks.get(key)
            if b is None or b.last_access_step == e.step:
                return  # the root of what is cached, or already touched by this batch
            if reuse:
                if self.residency is not None:
                    self.residency.reused(p.name, b.last_access_ts, e.ts)
                b.reuses += 1
            b.last_access_ts, b.last_access_step = e.ts, e.step
            if b.parent is None:
                return
            key = (medium, b.parent)

    def _removed(self, e: KVBlockRemoved) -> None:
        p = self._pod(e.pod)
        p.last_ts = _later(p.last_ts, e.ts)
        for h in e.block_hashes:
            key: _Key = (e.medium, h)
            if key not in p.blocks and e.medium is None:  # older vLLM sends no medium
                key = next(((m, h) for m in p.mediums if (m, h) in p.blocks), key)
            if key not in p.blocks:
                p.unknown_removals += 1
                continue
            p.removed_blocks += 1
            if p.blocks[key].copies > 1:  # another copy still holds the hash
                p.blocks[key].copies -= 1
                continue
            b = p.drop(key)
            if self.residency is not None:
                self.residency.removed(p.name, b.medium, b.hash, b.stored_ts, b.last_access_ts, e.ts)

    # ---- output ------------------------------------------------------------

    def to_snapshot(self) -> HashCacheSnapshot:
        return HashCacheSnapshot(self.step, {name: p.view() for name, p in self.pods.items()})

    def cached(self, pod: str) -> set[str]:
        """The hashes ``pod`` has cached (any medium)."""
        p = self.pods.get(pod)
        return set() if p is None else {k[1] for k in p.blocks}


def _later(a: float | None, b: float) -> float:
    return b if a is None or b > a else a

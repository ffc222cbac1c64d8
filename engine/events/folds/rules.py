"""The reducer's per-event rules: how each event type changes a ``PoolState``.

``HANDLERS`` maps every event class to its rule; ``PoolState.apply_event`` is
the only caller. A rule checks that its event fits the folded state and raises
``ImpossibleEventError`` when it does not (the engine and reducer drifted).
The semantics each rule follows are stated in ``engine.events.schema.types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.events.folds.folded_request import FoldedRequest
from engine.events.schema.request_status import RequestStatus
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, Event, EvictionReason,
    PrefixCacheReset, PrefixHit, PrefixLookup, RequestArrived, RequestFinished, RequestForked,
    RequestPreempted, RequestProgress, RequestScheduled,
)

if TYPE_CHECKING:
    from engine.events.folds.pool_state import PoolState


class ImpossibleEventError(ValueError):
    """An event does not fit the folded state: the engine and reducer drifted."""


# ---- checks and reference moves shared by the rules -------------------------

def _req(s: PoolState, e: Event, rid: str) -> FoldedRequest:
    r = s.requests.get(rid)
    if r is None:
        raise ImpossibleEventError(f"{e.type} at step {e.step}: unknown request {rid!r}")
    return r


def _block(s: PoolState, e: Event, b: int) -> int:
    if not isinstance(b, int) or not 0 <= b < s.num_blocks:
        raise ImpossibleEventError(f"{e.type} at step {e.step}: no block {b!r} "
                                   f"(pool has {s.num_blocks})")
    return b


def _take_fresh(s: PoolState, e: Event, b: int) -> None:
    """A free, hashless block gets its first reference (allocation or cow dst)."""
    _block(s, e, b)
    if s.ref[b] != 0:
        raise ImpossibleEventError(f"{e.type} at step {e.step}: block {b} has ref_count "
                                   f"{s.ref[b]}, expected a free block")
    if s.hash[b] is not None:
        raise ImpossibleEventError(f"{e.type} at step {e.step}: block {b} still holds hash "
                                   f"{s.hash[b][:12]}; a block_evicted must come first")
    del s.free[b]
    s.ref[b] = 1


def _touch(s: PoolState, e: Event, b: int) -> None:
    """Add a reference to an existing block (hit or fork)."""
    _block(s, e, b)
    if s.ref[b] == 0:
        del s.free[b]
    s.ref[b] += 1


# ---- block events ------------------------------------------------------------

def _allocated(s: PoolState, e: BlockAllocated) -> None:
    r = _req(s, e, e.request_id)
    if e.logical_index != len(r.table):
        raise ImpossibleEventError(f"block_allocated at step {e.step}: {e.request_id!r} has "
                                   f"{len(r.table)} blocks, event appends at {e.logical_index}")
    _take_fresh(s, e, e.block)
    r.table.append(e.block)


def _freed(s: PoolState, e: BlockFreed) -> None:
    b = _block(s, e, e.block)
    r = _req(s, e, e.request_id)
    if s.ref[b] - 1 != e.ref_count or s.ref[b] == 0:
        raise ImpossibleEventError(f"block_freed at step {e.step}: block {b} has ref_count "
                                   f"{s.ref[b]}, event says it drops to {e.ref_count}")
    if not r.table or r.table[-1] != b:  # tables are released tail first
        raise ImpossibleEventError(f"block_freed at step {e.step}: block {b} is not the last "
                                   f"block of {e.request_id!r}'s table {r.table}")
    r.table.pop()
    s.ref[b] -= 1
    if s.ref[b] == 0:
        s.free[b] = None
        if s.hash[b] is None:
            s.free.move_to_end(b, last=False)  # hashless: reused first


def _cached(s: PoolState, e: BlockCached) -> None:
    b = _block(s, e, e.block)
    if s.ref[b] == 0:
        raise ImpossibleEventError(f"block_cached at step {e.step}: block {b} is free")
    if s.hash[b] is not None:
        raise ImpossibleEventError(f"block_cached at step {e.step}: block {b} already holds a hash")
    s.hash[b] = e.hash
    s.block_tokens[b] = tuple(e.token_ids)


def _evicted(s: PoolState, e: BlockEvicted) -> None:
    # In-use blocks may lose their hash too (a reset or a rollback); the block
    # keeps its place (free queue or tables) whatever the reason.
    b = _block(s, e, e.block)
    if s.hash[b] != e.hash:
        raise ImpossibleEventError(f"block_evicted at step {e.step}: block {b} holds hash "
                                   f"{s.hash[b]!r}, event evicts {e.hash!r}")
    if e.reason is EvictionReason.REUSE and s.ref[b] != 0:
        raise ImpossibleEventError(f"block_evicted (reuse) at step {e.step}: block {b} has "
                                   f"ref_count {s.ref[b]}; only a free block is reused")
    s.hash[b] = None
    s.block_tokens[b] = None


def _prefix_hit(s: PoolState, e: PrefixHit) -> None:
    r = _req(s, e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"prefix_hit at step {e.step}: {e.request_id!r} already "
                                   f"holds blocks {r.table}")
    for b in e.blocks:
        _block(s, e, b)
        if s.hash[b] is None:
            raise ImpossibleEventError(f"prefix_hit at step {e.step}: block {b} is not cached")
    for b in e.blocks:
        _touch(s, e, b)
    r.table.extend(e.blocks)
    r.num_cached_tokens = r.num_computed_tokens = e.num_tokens


def _prefix_lookup(s: PoolState, e: PrefixLookup) -> None:
    # The lookup is recorded at admission, before its prefix_hit (if any).
    r = _req(s, e, e.request_id)
    r.num_cached_tokens = r.num_computed_tokens = e.num_hit_tokens


def _cow(s: PoolState, e: CowCopy) -> None:
    r = _req(s, e, e.request_id)
    i, src = e.logical_index, _block(s, e, e.src)
    if not (0 <= i < len(r.table) and r.table[i] == src):
        raise ImpossibleEventError(f"cow_copy at step {e.step}: {e.request_id!r} does not hold "
                                   f"src block {src} at logical index {i} ({r.table})")
    if s.ref[src] < 2:
        raise ImpossibleEventError(f"cow_copy at step {e.step}: src block {src} has "
                                   f"ref_count {s.ref[src]}, copy-on-write needs > 1")
    if s.ref[src] - 1 != e.src_ref_count:
        raise ImpossibleEventError(f"cow_copy at step {e.step}: src block {src} has ref_count "
                                   f"{s.ref[src]}, event says it drops to {e.src_ref_count}")
    _take_fresh(s, e, e.dst)
    s.ref[src] -= 1  # the request's reference moves from src to dst
    r.table[i] = e.dst


def _cache_reset(s: PoolState, e: PrefixCacheReset) -> None:
    stale = [b for b in s.free if s.hash[b] is not None]
    if stale:
        raise ImpossibleEventError(f"prefix_cache_reset at step {e.step}: free blocks {stale} "
                                   f"still hold hashes (block_evicted must precede the reset)")


# ---- request events ----------------------------------------------------------

def _arrived(s: PoolState, e: RequestArrived) -> None:
    if e.request_id in s.requests:
        raise ImpossibleEventError(f"request_arrived at step {e.step}: {e.request_id!r} exists")
    s.requests[e.request_id] = FoldedRequest(RequestStatus.WAITING, [], e.num_prompt_tokens, 0,
                                            0, list(e.prompt_token_ids), e.parent_id,
                                            e.arrival_index)


def _forked(s: PoolState, e: RequestForked) -> None:
    if e.request_id in s.requests:
        raise ImpossibleEventError(f"request_forked at step {e.step}: {e.request_id!r} exists")
    for b in e.blocks:
        _touch(s, e, b)
    # A table implies running (waiting/preempted requests hold no blocks); the child
    # inherits its parent's prefix-cache credit, as the engine's Request.fork does.
    parent = s.requests.get(e.parent_id)
    status = RequestStatus.RUNNING if e.blocks else RequestStatus.WAITING
    s.requests[e.request_id] = FoldedRequest(status, list(e.blocks),
                                            e.num_tokens, e.num_computed_tokens,
                                            parent.num_cached_tokens if parent else 0,
                                            list(e.token_ids), e.parent_id, e.arrival_index)


def _scheduled(s: PoolState, e: RequestScheduled) -> None:
    _req(s, e, e.request_id).status = RequestStatus.RUNNING


def _progress(s: PoolState, e: RequestProgress) -> None:
    r = _req(s, e, e.request_id)
    r.num_tokens, r.num_computed_tokens = e.num_tokens, e.num_computed_tokens
    r.token_ids.extend(e.new_token_ids)


def _preempted(s: PoolState, e: RequestPreempted) -> None:
    r = _req(s, e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"request_preempted at step {e.step}: {e.request_id!r} still "
                                   f"holds blocks {r.table} (block_freed events must precede)")
    r.status, r.num_computed_tokens = RequestStatus.PREEMPTED, 0


def _finished(s: PoolState, e: RequestFinished) -> None:
    r = _req(s, e, e.request_id)
    if r.table:
        raise ImpossibleEventError(f"request_finished at step {e.step}: {e.request_id!r} still "
                                   f"holds blocks {r.table} (block_freed events must precede)")
    del s.requests[e.request_id]


HANDLERS = {
    BlockAllocated: _allocated, BlockFreed: _freed, BlockCached: _cached,
    BlockEvicted: _evicted, PrefixHit: _prefix_hit, PrefixLookup: _prefix_lookup,
    CowCopy: _cow, PrefixCacheReset: _cache_reset, RequestArrived: _arrived,
    RequestForked: _forked, RequestScheduled: _scheduled, RequestProgress: _progress,
    RequestPreempted: _preempted, RequestFinished: _finished,
}

"""A step's events as table rows: what happened, to which request and block."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, Event, EvictionReason,
    PrefixHit, PrefixLookup, RequestArrived, RequestFinished, RequestForked, RequestProgress,
    RequestScheduled, KVAllCleared, KVBlockRemoved, KVBlockStored, KVGap, KVSegment,
)

_WHAT = {
    "block_allocated": "allocated",
    "block_freed": "released",
    "block_cached": "cached (hash kept)",
    "block_evicted": "evicted (hash dropped)",
    "prefix_hit": "prefix-cache hit",
    "prefix_lookup": "prefix-cache lookup",
    "cow_copy": "copy-on-write copy",
    "prefix_cache_reset": "prefix cache reset",
    "request_arrived": "request arrived",
    "request_forked": "forked (shares blocks)",
    "request_scheduled": "scheduled",
    "request_progress": "progress",
    "request_preempted": "preempted (blocks freed, will recompute)",
    "request_finished": "finished",
    "kv_block_stored": "stored (cached)",
    "kv_block_removed": "removed (evicted)",
    "kv_all_cleared": "all blocks cleared",
    "kv_gap": "HOLE: batches lost",
    "kv_segment": "stream (re)started",
}


_EVICTION_WHY = {EvictionReason.REUSE: "reused (LRU eviction)",
                 EvictionReason.RESET: "prefix cache reset",
                 EvictionReason.ROLLBACK: "withdrawn: the step's forward failed"}


def _detail(e: Event) -> tuple[str, str]:
    """(blocks, detail) columns for one event."""
    t = type(e)
    if t is BlockAllocated:
        return str(e.block), f"logical index {e.logical_index}"
    if t is BlockFreed:
        return str(e.block), f"ref count now {e.ref_count}"
    if t is BlockCached:
        return str(e.block), f"hash {e.hash[:12]}"
    if t is BlockEvicted:
        return str(e.block), f"hash {e.hash[:12]}; {_EVICTION_WHY[e.reason]}"
    if t is PrefixHit:
        return ", ".join(map(str, e.blocks)), f"{e.num_tokens} tokens reused"
    if t is PrefixLookup:
        causes = ", ".join(f"{c} {getattr(e, 'miss_' + c)}" for c in
                           ("cold", "evicted", "partial", "disabled") if getattr(e, "miss_" + c))
        return "", (("resumed after preemption: " if e.resumed else "")
                    + f"{e.num_hit_tokens}/{e.num_query_tokens} tokens hit"
                    + (f"; misses: {causes}" if causes else ""))
    if t is CowCopy:
        return f"{e.src} → {e.dst}", (f"logical index {e.logical_index}; "
                                      f"src ref count now {e.src_ref_count}")
    if t is RequestArrived:
        return "", f"{e.num_prompt_tokens} prompt tokens"
    if t is RequestForked:
        return ", ".join(map(str, e.blocks)), f"fork of {e.parent_id}"
    if t is RequestScheduled:
        return "", f"{e.num_tokens} {e.phase} tokens from position {e.num_computed_tokens}"
    if t is RequestProgress:
        return "", (f"+{len(e.new_token_ids)} token(s) {list(e.new_token_ids)[:4]}; "
                    f"{e.num_computed_tokens}/{e.num_tokens} computed")
    if t is RequestFinished:
        return "", f"reason: {e.reason}"
    if t is KVBlockStored:
        what = ("a placeholder (hash only, no tokens)" if e.is_placeholder else
                f"{len(e.block_hashes)} x {e.block_size} tokens after {(e.parent_hash or 'the root')[:12]}")
        return _hashes(e.block_hashes), f"pod {e.pod}; {what}" + _where(e)
    if t is KVBlockRemoved:
        return _hashes(e.block_hashes), f"pod {e.pod}" + _where(e)
    if t is KVAllCleared:
        return "", f"pod {e.pod}: its whole cache"
    if t is KVGap:
        return "", (f"pod {e.pod}: batches {e.first_seq}..{e.last_seq} of segment {e.segment} "
                    f"never arrived ({e.reason})")
    if t is KVSegment:
        return "", f"pod {e.pod}: segment {e.segment} from seq {e.first_seq} ({e.reason})"
    return "", ""


def _where(e) -> str:
    """``; GPU, group 0, LOCAL``: the tier and what else the source said about it."""
    parts = [e.medium, None if e.group_idx is None else f"group {e.group_idx}",
             getattr(e, "kv_cache_spec_kind", None), e.locality, e.ownership]
    parts = [p for p in parts if p]
    return "; " + ", ".join(parts) if parts else ""


def _hashes(hashes: tuple[str, ...], shown: int = 3) -> str:
    more = f" (+{len(hashes) - shown})" if len(hashes) > shown else ""
    return ", ".join(h[:12] for h in hashes[:shown]) + more


def event_rows(events: Iterable[Event]) -> list[dict[str, Any]]:
    """One row per event, in the order the engine emitted them."""
    rows = []
    for i, e in enumerate(events):
        blocks, detail = _detail(e)
        rows.append({"#": i, "event": e.type, "what": _WHAT.get(e.type, e.type),
                     "request": getattr(e, "request_id", "") or "", "blocks": blocks,
                     "detail": detail})
    return rows


# The caption's words per event kind: (one, many). Evictions are told apart by reason:
# a reset drops hashes of free blocks, which is no LRU eviction (it is counted apart).
_SUMMARY = {
    "block_allocated": ("block allocated", "blocks allocated"),
    "block_freed": ("block released", "blocks released"),
    "block_cached": ("block cached", "blocks cached"),
    "evicted:reuse": ("block evicted (LRU, reused)", "blocks evicted (LRU, reused)"),
    "evicted:reset": ("cached hash dropped by the prefix-cache reset",
                      "cached hashes dropped by the prefix-cache reset"),
    "evicted:rollback": ("hash withdrawn (failed forward)", "hashes withdrawn (failed forward)"),
    "prefix_hit": ("prefix-cache hit", "prefix-cache hits"),
    "cow_copy": ("copy-on-write copy", "copy-on-write copies"),
    "prefix_cache_reset": ("prefix-cache reset", "prefix-cache resets"),
    "request_arrived": ("request arrived", "requests arrived"),
    "request_forked": ("fork (shares blocks)", "forks (share blocks)"),
    "request_preempted": ("request preempted (will recompute)",
                          "requests preempted (will recompute)"),
    "request_finished": ("request finished", "requests finished"),
}


def plural(n: int, one: str, many: str | None = None) -> str:
    """``"1 copy"``, ``"3 copies"``: the count with the right form."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def step_summary(events: Iterable[Event]) -> str:
    """'3 blocks allocated · 1 block cached · …' for the grid caption."""
    counts: dict[str, int] = {}
    for e in events:
        if e.type in ("request_progress", "request_scheduled", "prefix_lookup"):
            continue  # every step has these; they would drown the rare ones
        kind = f"evicted:{EvictionReason(e.reason).value}" if type(e) is BlockEvicted else e.type
        counts[kind] = counts.get(kind, 0) + 1
    return " · ".join(plural(n, *_SUMMARY[k]) for k, n in counts.items()) or "no block changes"

"""Block residency from a hash-only stream: lifetimes, idle-before-evict, reuse gaps.

vLLM samples ``kv_block_lifetime_seconds``, ``kv_block_idle_before_evict_seconds`` and
``kv_block_reuse_gap_seconds`` inside the engine, where it sees every hit. A KV event
stream shows only stores and removals, so kvscope reads accesses from what a store
implies (``HashCacheState`` calls the hooks below):

- a block is **accessed** when it is stored, stored again while cached, or when a
  chain is stored below it (the request that stored the chain held the whole prefix
  above it). That drives ``last_access_ts``, so idle-before-evict = removal time −
  last access.
- a block is **certainly reused** when it is stored again while cached (vLLM's
  ``kv_cache_report_mode: "full"``) or when a chain is stored below it next to a
  child it already has (a branch: a second request shared the prefix). A chain that
  extends a leaf may be the same request's next chunk, so it is not counted as reuse.
  The reuse gap is the time since the block's previous access.
- lifetime = removal time − first store, for blocks this fold saw stored.
- recompute gap: a hash stored again after it was removed (its KV was computed twice;
  a short gap means it was evicted too early).

Hits that store nothing new (a fully cached prompt whose next block is not full yet)
are invisible in the stream, so idle times are upper bounds and reuse is a lower bound.
Times are the source's clock (its batch ``ts``).

Writer: ``HashCacheState`` through the hooks, on the thread that folds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MAX_REMEMBERED_REMOVALS = 100_000  # ~15 MB of keys at most; older removals are forgotten


@dataclass(slots=True)
class ResidencyLog:
    """Samples in seconds, each with the pod it came from, in fold order."""

    lifetime_s: list[tuple[str, float]] = field(default_factory=list)
    idle_before_evict_s: list[tuple[str, float]] = field(default_factory=list)
    reuse_gap_s: list[tuple[str, float]] = field(default_factory=list)
    recompute_gap_s: list[tuple[str, float]] = field(default_factory=list)
    _removed_at: OrderedDict[tuple[str, str | None, str], float] = field(default_factory=OrderedDict)

    def stored(self, pod: str, medium: str | None, block_hash: str, ts: float) -> None:
        removed = self._removed_at.pop((pod, medium, block_hash), None)
        if removed is not None:
            self.recompute_gap_s.append((pod, max(0.0, ts - removed)))

    def reused(self, pod: str, previous_access_ts: float, ts: float) -> None:
        self.reuse_gap_s.append((pod, max(0.0, ts - previous_access_ts)))

    def removed(self, pod: str, medium: str | None, block_hash: str, stored_ts: float,
                last_access_ts: float, ts: float) -> None:
        self.lifetime_s.append((pod, max(0.0, ts - stored_ts)))
        self.idle_before_evict_s.append((pod, max(0.0, ts - last_access_ts)))
        self._removed_at[(pod, medium, block_hash)] = ts
        if len(self._removed_at) > MAX_REMEMBERED_REMOVALS:
            self._removed_at.popitem(last=False)

    def cleared(self, pod: str) -> None:
        """A reset or restart: what was removed before says nothing about what comes next."""
        for key in [k for k in self._removed_at if k[0] == pod]:
            del self._removed_at[key]

    def values(self, name: str, pod: str | None = None) -> list[float]:
        """One sample list (``lifetime_s`` …), for one pod or all."""
        return [v for p, v in getattr(self, name) if pod is None or p == pod]

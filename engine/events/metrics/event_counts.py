"""``EventCounts``: what a stream of events adds up to, each count read off one event.

The one place events become counts. The engine's ``EventLog`` keeps one for the
engine's lifetime (``LLMEngine.stats()`` reads it, whether or not events are kept)
and ``MetricsTracker`` counts each step's events with another, so ``stats()`` and
the per-step metrics cannot disagree: same events, same rules. No count depends
on which events sit next to each other; each event carries its cause.

Prefix cache, in tokens (``prefix_lookup``; vLLM's ``PrefixCacheStats.record``):
- ``prefix_cache_queries``/``prefix_cache_hits``: first admissions with prefix
  caching on (vLLM's ``prefix_cache_queries``/``hits``).
- ``prefix_cache_resumed_queries``/``_hits``: lookups of resumed (preempted)
  requests, counted apart as vLLM's ``preempted_queries``/``preempted_hits``, so a
  victim re-finding its own blocks does not inflate the hit rate (vLLM #25780).
- ``prefix_cache_miss_{cold,evicted,partial}``: the misses of first admissions
  with caching on, by cause; they add up to queries − hits.
- ``prefix_cache_miss_disabled``: the tokens of first admissions while prefix
  caching was off. vLLM does not query then, and neither do the vLLM-named
  counters; this is kvscope's own figure.
Blocks (``block_evicted`` by reason): ``num_evictions`` (reuse: LRU pressure),
``num_reset_evictions``, ``num_rollback_evictions``; ``cow_copies`` (cow_copy);
``prefix_cache_resets`` (prefix_cache_reset events).
Requests: ``num_preemptions``, ``num_requests_finished``, ``num_output_tokens``
(tokens appended by request_progress), ``num_prefill_tokens``/``num_decode_tokens``
(request_scheduled, by phase).

Writer: whoever owns the instance calls ``add`` (the EventLog, on every event it
is handed; MetricsTracker, on a step's events). A core whose EventLog keeps no events
(a benchmark, a simulation that records nothing) builds none of the hot ones and calls
the rule's own ``count_*`` method with the fields the event would have carried, so the
counts are the same either way (tests/events/test_event_counts.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from engine.events.schema.types import (
    BlockEvicted, CowCopy, Event, EvictionReason, PrefixCacheReset, PrefixLookup,
    RequestFinished, RequestPreempted, RequestProgress, RequestScheduled, ScheduledPhase,
)

MISS_CAUSES = ("cold", "evicted", "partial", "disabled")

@dataclass(slots=True)
class EventCounts:
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_resumed_queries: int = 0
    prefix_cache_resumed_hits: int = 0
    prefix_cache_miss_cold: int = 0
    prefix_cache_miss_evicted: int = 0
    prefix_cache_miss_partial: int = 0
    prefix_cache_miss_disabled: int = 0
    num_preemptions: int = 0
    num_evictions: int = 0
    num_reset_evictions: int = 0
    num_rollback_evictions: int = 0
    cow_copies: int = 0
    prefix_cache_resets: int = 0
    num_requests_finished: int = 0
    num_output_tokens: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0

    @classmethod
    def of(cls, events: Iterable[Event]) -> EventCounts:
        counts = cls()
        for e in events:
            counts.add(e)
        return counts

    def add(self, e: Event) -> None:
        """Count one event. Runs for every event the engine writes, so it is one dict
        lookup for the types nothing counts (allocations, frees, caching, hits)."""
        rule = _RULES.get(type(e))
        if rule is not None:
            rule(self, e)

    def _progress(self, e: RequestProgress) -> None:
        self.count_progress(len(e.new_token_ids))

    def count_progress(self, num_new_tokens: int) -> None:
        """A ``request_progress`` event's count, from the tokens it appended."""
        self.num_output_tokens += num_new_tokens

    def _scheduled(self, e: RequestScheduled) -> None:
        self.count_scheduled(e.phase, e.num_tokens)

    def count_scheduled(self, phase: ScheduledPhase, num_tokens: int) -> None:
        """A ``request_scheduled`` event's count, from its fields."""
        if phase == ScheduledPhase.DECODE:
            self.num_decode_tokens += num_tokens
        else:
            self.num_prefill_tokens += num_tokens

    def _evicted(self, e: BlockEvicted) -> None:
        self.count_evicted(e.reason)

    def count_evicted(self, reason: EvictionReason, n: int = 1) -> None:
        """``n`` ``block_evicted`` events' count, from their reason."""
        if reason == EvictionReason.REUSE:
            self.num_evictions += n
        elif reason == EvictionReason.RESET:
            self.num_reset_evictions += n
        else:
            self.num_rollback_evictions += n

    def _lookup(self, e: PrefixLookup) -> None:
        if not e.caching_enabled:
            if not e.resumed:
                self.prefix_cache_miss_disabled += e.miss_disabled
        elif e.resumed:
            self.prefix_cache_resumed_queries += e.num_query_tokens
            self.prefix_cache_resumed_hits += e.num_hit_tokens
        else:
            self.prefix_cache_queries += e.num_query_tokens
            self.prefix_cache_hits += e.num_hit_tokens
            self.prefix_cache_miss_cold += e.miss_cold
            self.prefix_cache_miss_evicted += e.miss_evicted
            self.prefix_cache_miss_partial += e.miss_partial

    def _cow(self, e: CowCopy) -> None:
        self.cow_copies += 1

    def _preempted(self, e: RequestPreempted) -> None:
        self.num_preemptions += 1

    def _finished(self, e: RequestFinished) -> None:
        self.num_requests_finished += 1

    def _reset(self, e: PrefixCacheReset) -> None:
        self.prefix_cache_resets += 1

    def add_counts(self, other: EventCounts) -> None:
        """Add another instance's counts to this one."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """hits / queries of first admissions; None before any query."""
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else None


_RULES = {
    RequestProgress: EventCounts._progress, RequestScheduled: EventCounts._scheduled,
    BlockEvicted: EventCounts._evicted, PrefixLookup: EventCounts._lookup,
    CowCopy: EventCounts._cow, RequestPreempted: EventCounts._preempted,
    RequestFinished: EventCounts._finished, PrefixCacheReset: EventCounts._reset,
}

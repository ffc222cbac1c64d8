"""Per-step metrics from a step's events plus the post-step pool summary (pure Python).

Writer: the engine owns one ``MetricsTracker`` and calls ``update`` once per step;
the result is the ``metrics`` dict of that step's ``StepRecord``. Names follow
vLLM where vLLM has one. "Cumulative" means since construction or the last
``reset()`` (one run), which answers vLLM #46938 (no per-run hit rate there).
A rate or percentile with nothing to divide or rank is ``None``.

Pool (from the PoolSummary; a block is *referenced* when its ref_count > 0):
- ``kv_cache_usage``: referenced blocks / all blocks (fraction 0..1). Unlike vLLM
  every block counts, so cached-but-free blocks are free here as there.
- ``kv_token_usage``: filled slots of referenced blocks / all slots (fraction).
- ``internal_fragmentation``: 1 − filled / slots of referenced blocks (fraction);
  a shared block is counted once; 0.0 when no block is referenced.
- ``num_used_blocks``, ``num_free_blocks``, ``num_shared_blocks`` (ref > 1),
  ``num_cached_free_blocks`` (ref 0 with a hash: hittable, evicted LRU) — blocks;
  ``num_filled_slots`` — token slots (the PoolSummary's fill).
Counters, each cumulative and with a ``_step`` twin, as ``EventCounts`` defines
them (engine.events.metrics.event_counts; one lookup per admission, each event counted by
its own fields):
- prefix cache (tokens): ``prefix_cache_queries``, ``prefix_cache_hits`` (first
  admissions, caching on: vLLM's), ``prefix_cache_resumed_queries``/``_hits``
  (lookups of preempted requests, apart), ``prefix_cache_miss_{cold,evicted,partial}``
  (first admissions' misses by cause: they add up to queries − hits) and
  ``prefix_cache_miss_disabled`` (first admissions with caching off);
- ``prefix_cache_hit_rate`` = hits / queries (cumulative), ``prefix_cache_hit_rate_step``;
- ``num_preemptions``, ``num_evictions`` (block_evicted, reason reuse: LRU),
  ``num_reset_evictions``, ``num_rollback_evictions``, ``cow_copies``,
  ``prefix_cache_resets``, ``num_requests_finished``.
Scheduler (requests from the PoolSummary, tokens from request_scheduled this step):
- ``num_requests_waiting`` (status waiting, preempted excluded),
  ``num_requests_running``, ``num_requests_preempted`` — requests.
- ``num_prefill_tokens``, ``num_decode_tokens``, ``num_batched_tokens`` (their
  sum), ``token_budget`` (= max_num_batched_tokens) — tokens;
  ``budget_used`` = num_batched_tokens / token_budget (fraction).
Latency (seconds; observations the engine hands in for this step):
- ``ttft_s``, ``itl_s``, ``e2e_s``: lists observed this step.
- ``{ttft,itl,e2e}_{p50,p90,p99}_s``: percentiles over the run's latest
  ``MAX_LATENCY_SAMPLES`` observations of each (all of them in a shorter run; linear
  interpolation between closest ranks, as numpy's default). Bounded on purpose: a
  run-long sorted list grew by every token (ITL) and every insert moved it all, so a
  10-minute soak's steps got slower and its memory grew with every request served.
Requests (the output processor's per-request figures, ``engine.events.metrics.request_stats``):
``first_tokens`` and ``finished_requests``, the ``to_dict()`` of each FirstTokenStats /
FinishedRequestStats of this step (empty lists when none).
Throughput: ``num_output_tokens_step`` (tokens appended by request_progress),
``num_output_tokens`` (cumulative), ``output_throughput_tps`` (tokens/s): with the
steps whose ts lies in [now − window, now], the tokens of all but the oldest of
them over (now − oldest ts); ``None`` until two steps fall in the window.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events.metrics.event_counts import MISS_CAUSES, EventCounts
from engine.events.metrics.pool_summary import PoolSummary
from engine.events.metrics.request_stats import FinishedRequestStats, FirstTokenStats
from engine.events.schema.types import Event

__all__ = ["MAX_LATENCY_SAMPLES", "MISS_CAUSES", "LatencyObservations", "LatencyWindow", "MetricsConfig",
           "MetricsTracker", "percentile"]

_PERCENTILES = (50, 90, 99)
MAX_LATENCY_SAMPLES = 4096  # per kind: ~35 KB sorted; inserting moves at most that


class LatencyWindow:
    """The latest ``capacity`` observations, kept sorted for percentiles."""

    def __init__(self, capacity: int = MAX_LATENCY_SAMPLES) -> None:
        self.capacity = capacity
        self.sorted: list[float] = []
        self._arrival: deque[float] = deque()

    def add(self, v: float) -> None:
        bisect.insort(self.sorted, v)
        self._arrival.append(v)
        if len(self._arrival) > self.capacity:  # drop the oldest (one equal value: the same rank)
            old = self._arrival.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def __len__(self) -> int:
        return len(self.sorted)


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Pool and scheduler sizes the figures are relative to."""

    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    throughput_window_s: float = 10.0  # long enough to smooth step jitter, short enough to react

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not self.throughput_window_s > 0:
            raise ValueError(f"throughput_window_s must be > 0, got {self.throughput_window_s!r}")


@dataclass(frozen=True, slots=True)
class LatencyObservations:
    """Latencies completed this step, in seconds (the engine measures them)."""

    ttft_s: tuple[float, ...] = ()
    itl_s: tuple[float, ...] = ()
    e2e_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s", "e2e_s"):
            v = getattr(self, name)
            object.__setattr__(self, name, tuple(float(x) for x in v))
            if any(x < 0 for x in getattr(self, name)):
                raise ValueError(f"{name} holds a negative latency: {v!r}")


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100) of ascending values, linear interpolation; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class MetricsTracker:
    """Turns each step into its metrics dict; keeps the run's counters and samples."""

    # EventCounts fields exported cumulative + ``_step``; the scheduled-token
    # counts are per-step figures only.
    _COUNTERS = tuple(f.name for f in dataclasses.fields(EventCounts)
                      if f.name not in ("num_prefill_tokens", "num_decode_tokens"))

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Start a new run: zero the counters, latency samples and throughput window."""
        self.totals = EventCounts()
        self._samples = {"ttft": LatencyWindow(), "itl": LatencyWindow(), "e2e": LatencyWindow()}
        self._window: deque[tuple[float, int]] = deque()  # (step ts, output tokens)
        self._window_tokens = 0  # the sum of the window's output tokens

    def update(self, events: Iterable[Event], pool: PoolSummary, ts: float,
               latencies: LatencyObservations | None = None,
               first_tokens: Sequence[FirstTokenStats] = (),
               finished_requests: Sequence[FinishedRequestStats] = ()) -> dict[str, Any]:
        """Metrics of one step: its events, the pool after it, its end time ``ts``,
        and the latencies and per-request figures the output processor measured.

        ``pool`` comes from ``Scheduler.pool_summary()`` (live),
        ``PoolState.summary()`` or ``PoolSnapshot.summary()``.
        """
        step = EventCounts.of(events)
        self.totals.add_counts(step)
        prefill, decode = step.num_prefill_tokens, step.num_decode_tokens

        out: dict[str, Any] = {"step": pool.step, "ts": ts}
        out.update(pool.figures())
        for k in self._COUNTERS:
            out[k] = getattr(self.totals, k)
            out[f"{k}_step"] = getattr(step, k)
        out["prefix_cache_hit_rate"] = self.totals.prefix_cache_hit_rate
        out["prefix_cache_hit_rate_step"] = step.prefix_cache_hit_rate

        out.update(pool.request_counts())
        budget = self.config.max_num_batched_tokens
        out.update(num_prefill_tokens=prefill, num_decode_tokens=decode,
                   num_batched_tokens=prefill + decode, token_budget=budget,
                   budget_used=(prefill + decode) / budget)

        lat = latencies or LatencyObservations()
        for name, values in (("ttft", lat.ttft_s), ("itl", lat.itl_s), ("e2e", lat.e2e_s)):
            window = self._samples[name]
            for v in values:
                window.add(v)
            out[f"{name}_s"] = list(values)
            for q in _PERCENTILES:
                out[f"{name}_p{q}_s"] = percentile(window.sorted, q)

        out["first_tokens"] = [s.to_dict() for s in first_tokens]
        out["finished_requests"] = [s.to_dict() for s in finished_requests]
        out["output_throughput_tps"] = self._throughput(ts, step.num_output_tokens)
        return out

    def _throughput(self, ts: float, tokens: int) -> float | None:
        w = self._window
        w.append((ts, tokens))
        self._window_tokens += tokens
        while w and w[0][0] < ts - self.config.throughput_window_s:
            self._window_tokens -= w.popleft()[1]
        if len(w) < 2 or ts <= w[0][0]:
            return None
        # a running sum: the window holds thousands of steps at a tiny model's step rate
        return (self._window_tokens - w[0][1]) / (ts - w[0][0])

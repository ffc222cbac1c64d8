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
  ``num_cached_free_blocks`` (ref 0 with a hash: hittable, evicted LRU) — blocks.
Prefix cache (tokens, from ``prefix_lookup`` events; one lookup per admission):
- ``prefix_cache_queries``, ``prefix_cache_hits`` (cumulative) and ``_step`` twins.
- ``prefix_cache_hit_rate`` = hits / queries (cumulative), ``prefix_cache_hit_rate_step``.
- ``prefix_cache_miss_{cold,evicted,partial,disabled}`` (+ ``_step``): misses by cause;
  the four add up to queries − hits, cumulative and per step.
Counters (events): ``num_preemptions`` (request_preempted), ``num_evictions``
(block_evicted of LRU reuse; the evictions of a prefix-cache reset are counted in
``prefix_cache_resets`` instead), ``cow_copies`` — each cumulative and ``_step``;
``num_requests_finished`` (+ ``_step``).
Scheduler (requests from the PoolSummary, tokens from request_scheduled this step):
- ``num_requests_waiting`` (status waiting, preempted excluded),
  ``num_requests_running``, ``num_requests_preempted`` — requests.
- ``num_prefill_tokens``, ``num_decode_tokens``, ``num_batched_tokens`` (their
  sum), ``token_budget`` (= max_num_batched_tokens) — tokens;
  ``budget_used`` = num_batched_tokens / token_budget (fraction).
Latency (seconds; observations the engine hands in for this step):
- ``ttft_s``, ``itl_s``, ``e2e_s``: lists observed this step.
- ``{ttft,itl,e2e}_{p50,p90,p99}_s``: percentiles over the run (linear interpolation
  between closest ranks, as numpy's default).
Requests (the output processor's per-request figures, ``engine.events.request_stats``):
``first_tokens`` and ``finished_requests``, the ``to_dict()`` of each FirstTokenStats /
FinishedRequestStats of this step (empty lists when none).
Throughput: ``num_output_tokens_step`` (tokens appended by request_progress),
``num_output_tokens`` (cumulative), ``output_throughput_tps`` (tokens/s): with the
steps whose ts lies in [now − window, now], the tokens of all but the oldest of
them over (now − oldest ts); ``None`` until two steps fall in the window.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.pool_summary import PoolSummary
from engine.events import types as T
from engine.events.request_stats import FinishedRequestStats, FirstTokenStats

MISS_CAUSES = ("cold", "evicted", "partial", "disabled")
_PERCENTILES = (50, 90, 99)


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


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


class MetricsTracker:
    """Turns each step into its metrics dict; keeps the run's counters and samples."""

    _COUNTERS = ("prefix_cache_queries", "prefix_cache_hits",
                 *(f"prefix_cache_miss_{c}" for c in MISS_CAUSES),
                 "num_preemptions", "num_evictions", "cow_copies", "prefix_cache_resets",
                 "num_requests_finished", "num_output_tokens")

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Start a new run: zero the counters, latency samples and throughput window."""
        self._totals = dict.fromkeys(self._COUNTERS, 0)
        self._samples: dict[str, list[float]] = {"ttft": [], "itl": [], "e2e": []}
        self._window: deque[tuple[float, int]] = deque()  # (step ts, output tokens)

    def update(self, events: Iterable[T.Event], pool: PoolSummary, ts: float,
               latencies: LatencyObservations | None = None,
               first_tokens: Sequence[FirstTokenStats] = (),
               finished_requests: Sequence[FinishedRequestStats] = ()) -> dict[str, Any]:
        """Metrics of one step: its events, the pool after it, its end time ``ts``,
        and the latencies and per-request figures the output processor measured.

        ``pool`` comes from ``Scheduler.pool_summary()`` (live) or
        ``summarize_snapshot`` (a snapshot dict).
        """
        step = dict.fromkeys(self._COUNTERS, 0)
        prefill = decode = 0
        evict_run = 0  # consecutive block_evicted events; a reset claims the run before it
        for e in events:
            t = type(e)
            if t is T.BlockEvicted:
                evict_run += 1
                continue
            if t is T.PrefixCacheReset:
                step["prefix_cache_resets"] += 1
            else:
                step["num_evictions"] += evict_run
            evict_run = 0
            if t is T.PrefixLookup:
                step["prefix_cache_queries"] += e.num_query_tokens
                step["prefix_cache_hits"] += e.num_hit_tokens
                for c in MISS_CAUSES:
                    step[f"prefix_cache_miss_{c}"] += getattr(e, f"miss_{c}")
            elif t is T.RequestScheduled:
                if e.phase == "decode":
                    decode += e.num_tokens
                else:
                    prefill += e.num_tokens
            elif t is T.RequestPreempted:
                step["num_preemptions"] += 1
            elif t is T.CowCopy:
                step["cow_copies"] += 1
            elif t is T.RequestFinished:
                step["num_requests_finished"] += 1
            elif t is T.RequestProgress:
                step["num_output_tokens"] += len(e.new_token_ids)
        step["num_evictions"] += evict_run

        out: dict[str, Any] = {"step": pool.step, "ts": ts}
        out.update(pool.figures())
        for k in self._COUNTERS:
            self._totals[k] += step[k]
            out[k] = self._totals[k]
            out[f"{k}_step"] = step[k]
        out["prefix_cache_hit_rate"] = _ratio(self._totals["prefix_cache_hits"],
                                              self._totals["prefix_cache_queries"])
        out["prefix_cache_hit_rate_step"] = _ratio(step["prefix_cache_hits"],
                                                   step["prefix_cache_queries"])

        out.update(pool.request_counts())
        budget = self.config.max_num_batched_tokens
        out.update(num_prefill_tokens=prefill, num_decode_tokens=decode,
                   num_batched_tokens=prefill + decode, token_budget=budget,
                   budget_used=(prefill + decode) / budget)

        lat = latencies or LatencyObservations()
        for name, values in (("ttft", lat.ttft_s), ("itl", lat.itl_s), ("e2e", lat.e2e_s)):
            samples = self._samples[name]
            for v in values:
                bisect.insort(samples, v)
            out[f"{name}_s"] = list(values)
            for q in _PERCENTILES:
                out[f"{name}_p{q}_s"] = percentile(samples, q)

        out["first_tokens"] = [s.to_dict() for s in first_tokens]
        out["finished_requests"] = [s.to_dict() for s in finished_requests]
        out["output_throughput_tps"] = self._throughput(ts, step["num_output_tokens"])
        return out

    def _throughput(self, ts: float, tokens: int) -> float | None:
        w = self._window
        w.append((ts, tokens))
        while w and w[0][0] < ts - self.config.throughput_window_s:
            w.popleft()
        if len(w) < 2 or ts <= w[0][0]:
            return None
        return (sum(n for _, n in w) - w[0][1]) / (ts - w[0][0])

"""Prometheus text from vLLM, SGLang or kvscope → the figures attach mode shows.

``read_sample`` reads one scrape into raw totals; ``ScrapeFold`` folds successive
samples into figures for the run (counters as increases since the attach, so a
figure covers exactly this run, and a counter that went back, an engine restart,
is read as starting again from 0):

| figure | vLLM (and kvscope) | SGLang |
|---|---|---|
| ``kv_cache_usage`` (0..1) | ``vllm:kv_cache_usage_perc`` (older ``vllm:gpu_cache_usage_perc``) | ``sglang:token_usage`` |
| ``num_requests_running`` | ``vllm:num_requests_running`` | ``sglang:num_running_reqs`` |
| ``num_requests_waiting`` | ``vllm:num_requests_waiting`` | ``sglang:num_queue_reqs`` |
| ``prefix_cache_hit_rate`` | ``prefix_cache_hits`` / ``prefix_cache_queries`` (tokens, ``vllm:``, older ``vllm:gpu_``) | ``sglang:cache_hit_rate`` (its own gauge) |
| ``num_preemptions`` | ``vllm:num_preemptions`` | ``sglang:num_retracted_requests`` |
| ``ttft_*_s`` | ``vllm:time_to_first_token_seconds`` | ``sglang:time_to_first_token_seconds`` |
| ``prefix_cache_miss_{cold,evicted,partial}`` | kvscope only: ``kvscope_prefix_cache_misses{cause}`` | – |
| ``kv_token_usage`` (0..1) | kvscope only: ``kvscope_kv_token_usage`` (filled token slots / all slots) | – |
| ``num_gpu_blocks`` | ``vllm:cache_config_info``'s ``num_gpu_blocks`` label | – |

Gauges summed over label sets (one series per engine or model), usage averaged.
Pure Python (prometheus_client's parser); the thread is ``engine.attach.scraper``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

GAUGES = {  # figure -> candidate metric names, first present wins
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "num_requests_running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "num_requests_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "engine_hit_rate": ("sglang:cache_hit_rate",),  # an engine's own rate, when it has no counters
    "kv_token_usage": ("kvscope_kv_token_usage",),  # token against block occupancy (kvscope pods)
}
MEAN_GAUGES = ("kv_cache_usage", "engine_hit_rate", "kv_token_usage")
INFO_LABELS = {"num_gpu_blocks": ("vllm:cache_config_info", "num_gpu_blocks")}  # figure -> (info, label)
COUNTERS = {  # figure -> candidate counter names (without _total)
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "num_preemptions": ("vllm:num_preemptions", "sglang:num_retracted_requests"),
}
LABELLED_COUNTERS = {  # figure -> (counter name without _total, label, value): one label set's series
    f"prefix_cache_miss_{cause}": ("kvscope_prefix_cache_misses", "cause", cause)
    for cause in ("cold", "evicted", "partial")  # the engine's own miss causes (kvscope pods)
}
TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")


@dataclass(frozen=True, slots=True)
class RawSample:
    """One scrape: gauges now, counter totals, and the TTFT histogram's totals."""

    gauges: dict[str, float]
    counters: dict[str, float]
    ttft_sum: float | None
    ttft_count: float | None
    ttft_buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), le ascending


def read_sample(text: str) -> RawSample:
    """Parse Prometheus text; ValueError when it is not the exposition format."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                samples.setdefault(s.name, []).append((s.labels, s.value))
    except Exception as exc:  # the parser raises bare ValueErrors and worse on junk
        raise ValueError(f"not Prometheus text: {exc}") from None
    gauges: dict[str, float] = {}
    for figure, names in GAUGES.items():
        for name in names:
            values = [v for _, v in samples.get(name, ()) if math.isfinite(v)]
            if values:
                gauges[figure] = sum(values) / len(values) if figure in MEAN_GAUGES else sum(values)
                break
    for figure, (name, label) in INFO_LABELS.items():
        values = {labels.get(label) for labels, _ in samples.get(name, ())} - {None, "", "None"}
        if len(values) == 1:  # one engine's pool (a label that differs between series: no figure)
            try:
                gauges[figure] = float(values.pop())
            except ValueError:
                pass
    counters: dict[str, float] = {}
    for figure, names in COUNTERS.items():
        for name in names:
            values = [v for _, v in samples.get(name + "_total", samples.get(name, ()))]
            if values:
                counters[figure] = sum(values)
                break
    for figure, (name, label, value) in LABELLED_COUNTERS.items():
        values = [v for labels, v in samples.get(name + "_total", samples.get(name, ()))
                  if labels.get(label) == value]
        if values:
            counters[figure] = sum(values)
    ttft_sum = ttft_count = None
    buckets: dict[float, float] = {}
    for name in TTFT:
        if name + "_count" in samples:
            ttft_sum = sum(v for _, v in samples.get(name + "_sum", ()))
            ttft_count = sum(v for _, v in samples[name + "_count"])
            for labels, v in samples.get(name + "_bucket", ()):
                le = float(labels.get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + v
            break
    return RawSample(gauges, counters, ttft_sum, ttft_count, tuple(sorted(buckets.items())))


def _increase(prev: float | None, cur: float) -> float:
    """A counter's increase between two scrapes; a drop means it restarted from 0."""
    if prev is None:
        return 0.0
    return cur - prev if cur >= prev else cur


@dataclass(slots=True)
class ScrapeFold:
    """Folds one pod's scrapes into the figures of this run (writer: its scraper thread)."""

    _prev: RawSample | None = None
    _since: dict[str, float] = field(default_factory=dict)  # counter increases since the attach
    _ttft_sum: float = 0.0
    _ttft_count: float = 0.0
    _ttft_buckets: dict[float, float] = field(default_factory=dict)
    _recent_hits: tuple[float, float] = (0.0, 0.0)  # (hits, queries) of the last interval

    def add(self, raw: RawSample) -> None:
        prev = self._prev
        for k, v in raw.counters.items():
            self._since[k] = self._since.get(k, 0.0) + _increase(
                None if prev is None else prev.counters.get(k), v)
        if prev is not None:
            hits = _increase(prev.counters.get("prefix_cache_hits"), raw.counters.get("prefix_cache_hits", 0.0))
            queries = _increase(prev.counters.get("prefix_cache_queries"),
                                raw.counters.get("prefix_cache_queries", 0.0))
            self._recent_hits = (hits, queries)
            if raw.ttft_count is not None:
                self._ttft_sum += _increase(prev.ttft_sum, raw.ttft_sum or 0.0)
                self._ttft_count += _increase(prev.ttft_count, raw.ttft_count)
                before = dict(prev.ttft_buckets)
                for le, v in raw.ttft_buckets:
                    self._ttft_buckets[le] = self._ttft_buckets.get(le, 0.0) + _increase(before.get(le), v)
        self._prev = raw

    def figures(self) -> dict[str, Any]:
        """The figures now (JSON-able; absent where the engine exports nothing to read)."""
        raw = self._prev
        if raw is None:
            return {}
        out: dict[str, Any] = {k: v for k, v in raw.gauges.items() if k != "engine_hit_rate"}
        for k, v in self._since.items():
            out[k] = v
        queries, hits = self._since.get("prefix_cache_queries"), self._since.get("prefix_cache_hits")
        if queries is not None and hits is not None:
            out["prefix_cache_hit_rate"] = hits / queries if queries > 0 else None
            rh, rq = self._recent_hits
            out["prefix_cache_hit_rate_recent"] = rh / rq if rq > 0 else None
        elif "engine_hit_rate" in raw.gauges:
            out["prefix_cache_hit_rate"] = raw.gauges["engine_hit_rate"]
        if raw.ttft_count is not None:
            out["ttft_count"] = self._ttft_count
            out["ttft_mean_s"] = self._ttft_sum / self._ttft_count if self._ttft_count else None
            out["ttft_p50_s"] = quantile(0.5, self._ttft_buckets, self._ttft_count)
            out["ttft_p90_s"] = quantile(0.9, self._ttft_buckets, self._ttft_count)
        return out


def quantile(q: float, buckets: dict[float, float], count: float) -> float | None:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in."""
    if count <= 0 or not buckets:
        return None
    rank = q * count
    lo_le, lo_count = 0.0, 0.0
    for le, c in sorted(buckets.items()):
        if c >= rank:
            if math.isinf(le):
                return lo_le  # past the last finite bound: its lower edge, as Prometheus
            if c == lo_count:
                return le
            return lo_le + (le - lo_le) * (rank - lo_count) / (c - lo_count)
        lo_le, lo_count = le, c
    return lo_le

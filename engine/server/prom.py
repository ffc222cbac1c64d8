"""Prometheus metrics of the server (``GET /metrics``), in their own registry.

Names follow vLLM's ``vllm:*`` where vLLM has the figure, so existing vLLM
dashboards and alerts work; everything else is ``kvscope_*``. Counters are fed
with each step's ``*_step`` deltas, so they stay monotonic across restarts (the
engine's own cumulative figures start again with each run). Gauges show the
latest step. prometheus_client appends ``_total`` to counters: the names given
here omit it so the exposed names are exactly vLLM's.

Writer: the Hub calls ``observe_step`` on the event-loop thread; scrapes also
run there (the websocket handshake hook), so reads and writes never race.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.events.metrics import MISS_CAUSES
from engine.store.recorder_health import RecorderHealth

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes

# vLLM's buckets, so histograms line up with vLLM's dashboards.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# (step metric, gauge name, help)
_GAUGES = (
    ("kv_cache_usage", "vllm:kv_cache_usage_perc",
     "KV-cache usage: referenced blocks / all blocks (1 = 100%)."),
    ("num_requests_running", "vllm:num_requests_running", "Requests running on the engine."),
    ("num_requests_waiting", "vllm:num_requests_waiting", "Requests waiting to be scheduled."),
    ("kv_token_usage", "kvscope_kv_token_usage", "Filled token slots / all token slots."),
    ("internal_fragmentation", "kvscope_internal_fragmentation",
     "1 - filled slots / slots of referenced blocks (shared blocks once)."),
    ("num_used_blocks", "kvscope_num_used_blocks", "Blocks with ref_count > 0."),
    ("num_free_blocks", "kvscope_num_free_blocks", "Blocks with ref_count 0."),
    ("num_shared_blocks", "kvscope_num_shared_blocks", "Blocks with ref_count > 1."),
    ("num_cached_free_blocks", "kvscope_num_cached_free_blocks", "Free blocks that still hold a hash."),
    ("num_requests_preempted", "kvscope_num_requests_preempted", "Requests preempted and waiting to resume."),
    ("prefix_cache_hit_rate", "kvscope_prefix_cache_hit_rate",
     "Prefix-cache hit tokens / query tokens, this run."),
    ("budget_used", "kvscope_budget_used", "Batched tokens / max_num_batched_tokens, last step."),
    ("output_throughput_tps", "kvscope_output_throughput_tokens_per_second", "Output tokens per second."),
)
# (step delta, counter name without _total, help)
_COUNTERS = (
    ("prefix_cache_queries_step", "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens."),
    ("prefix_cache_hits_step", "vllm:prefix_cache_hits", "Prefix-cache hits, in tokens."),
    ("num_preemptions_step", "vllm:num_preemptions", "Cumulative number of preemptions."),
    ("num_output_tokens_step", "vllm:generation_tokens", "Number of generation tokens processed."),
    ("num_evictions_step", "kvscope_evictions", "Cached blocks evicted (LRU reuse)."),
    ("cow_copies_step", "kvscope_cow_copies", "Copy-on-write block copies."),
    ("prefix_cache_resets_step", "kvscope_prefix_cache_resets", "Prefix-cache resets."),
    ("num_requests_finished_step", "kvscope_requests_finished", "Requests finished."),
    ("num_prefill_tokens", "kvscope_prefill_tokens", "Prefill tokens computed."),
    ("num_decode_tokens", "kvscope_decode_tokens", "Decode tokens computed."),
)


class ServerMetrics:
    """The registry behind ``/metrics``."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._gauges = {key: Gauge(name, doc, registry=r) for key, name, doc in _GAUGES}
        self._counters = {key: Counter(name, doc, registry=r) for key, name, doc in _COUNTERS}
        self._misses = Counter("kvscope_prefix_cache_misses", "Prefix-cache miss tokens by cause.",
                               ["cause"], registry=r)
        for cause in MISS_CAUSES:  # expose every cause from the start, at 0
            self._misses.labels(cause)
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token in seconds.",
                               buckets=TTFT_BUCKETS, registry=r)
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency in seconds.",
                              buckets=ITL_BUCKETS, registry=r)
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                              buckets=E2E_BUCKETS, registry=r)
        self.steps = Counter("kvscope_steps", "Engine steps published.", registry=r)
        self.num_blocks = Gauge("kvscope_num_blocks", "Blocks in the KV pool.", registry=r)
        self.block_size = Gauge("kvscope_block_size", "Token slots per block.", registry=r)
        self.connections = Gauge("kvscope_ws_connections", "Open websocket connections.", registry=r)
        self.dropped_steps = Counter("kvscope_ws_dropped_step_messages",
                                     "Step messages dropped for slow clients (they resync).", registry=r)
        self.errors = Counter("kvscope_ws_errors", "Error messages sent, by code.", ["code"], registry=r)
        self.outbox_max = Gauge("kvscope_ws_outbox_max_step_messages",
                                "Largest queue of unsent step messages over connected clients.", registry=r)

    def watch_hub(self, connections: Callable[[], int], outbox_max: Callable[[], int]) -> None:
        """Gauges read at scrape time from the hub."""
        self.connections.set_function(connections)
        self.outbox_max.set_function(outbox_max)

    def watch_recorder(self, health: Callable[[], RecorderHealth]) -> None:
        """The recorder's figures, read at scrape time from ``Recorder.health``."""
        self.registry.register(_RecorderCollector(health))

    def watch_config(self, config: Callable[[], dict[str, Any]]) -> None:
        """Pool-shape gauges read at scrape time from the current engine config."""
        self.num_blocks.set_function(lambda: config().get("num_blocks") or 0)
        self.block_size.set_function(lambda: config().get("block_size") or 0)

    def observe_step(self, metrics: dict[str, Any]) -> None:
        """Fold one step's metrics dict (see engine.events.metrics) into the registry."""
        self.steps.inc()
        for key, gauge in self._gauges.items():
            v = metrics.get(key)
            if isinstance(v, (int, float)):
                gauge.set(v)
        for key, counter in self._counters.items():
            v = metrics.get(key)
            if isinstance(v, (int, float)) and v > 0:
                counter.inc(v)
        for cause in MISS_CAUSES:
            v = metrics.get(f"prefix_cache_miss_{cause}_step")
            if isinstance(v, (int, float)) and v > 0:
                self._misses.labels(cause).inc(v)
        for key, hist in (("ttft_s", self._ttft), ("itl_s", self._itl), ("e2e_s", self._e2e)):
            for v in metrics.get(key) or ():
                hist.observe(v)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RecorderCollector:
    """``kvscope_recorder_*``: totals the recorder keeps itself (so they never reset
    with an engine restart), exposed as counters; backlog and liveness as gauges."""

    def __init__(self, health: Callable[[], RecorderHealth]) -> None:
        self.health = health

    def collect(self):
        h = self.health()
        for name, doc, value in (
                ("kvscope_recorder_errors", "Failed recorder write attempts (database faults).",
                 h.errors_total),
                ("kvscope_recorder_dropped_steps", "Steps dropped: the backlog passed its bound "
                 "while the database failed (marked in the run).", h.dropped_steps_total),
                ("kvscope_recorder_dropped_requests", "Finished requests' rows dropped the same way.",
                 h.dropped_requests_total),
                ("kvscope_recorder_skipped_rows", "Rows the database could never store, skipped.",
                 h.skipped_rows_total),
                ("kvscope_recorder_written_rows", "Rows the recorder committed.", h.written_rows_total)):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("kvscope_recorder_backlog_steps",
                                "Steps queued or held for a retry, not yet committed.", value=h.backlog_steps)
        yield GaugeMetricFamily("kvscope_recorder_up", "1 while the recorder's writer runs and writes "
                                "succeed, else 0.", value=int(h.alive and h.fault is None))

"""Prometheus metrics of the server (``GET /metrics``), in their own registry.

vLLM's single-engine set under vLLM's names, types, help texts, labels and buckets
(``engine.server.metrics.vllm_families``), so vLLM's Grafana dashboards and alerts work
unchanged; kvscope's own figures as ``kvscope_*`` (``...kvscope_families``). Every series
carries ``model_name`` (the served model name) and ``engine="0"``, except
``vllm:cache_config_info``, which has vLLM's labels: its CacheConfig's fields and ``engine``.

The format is always the plain text format 0.0.4, whatever the scraper's ``Accept``
says: prometheus_client's negotiating handler would answer an OpenMetrics scraper (as
Prometheus is) in a format that rewrites ``vllm:x`` to ``vllm_x`` and breaks every
dashboard query. Prometheus reads the text format fine.

A run's settings (cache labels, the 1-2-5 token buckets of its ``max_model_len``, the
block residency of its pool) follow ``start_run``: the hub calls it for every new run
it delivers; the first run is picked up from ``watch_config`` at its first step or
scrape.

Writer: the Hub calls ``observe_step`` and ``start_run`` on the event-loop thread;
scrapes also run there (the /metrics route), so reads and writes never race.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.events.metrics.block_residency import BlockResidency
from engine.events.schema.step import StepRecord
from engine.server.worker.health import StepFaults
from engine.server.metrics.kvscope_families import KVScopeFamilies
from engine.server.metrics.series import Series
from engine.server.metrics.vllm_families import VLLMFamilies
from engine.store.recorder_health import RecorderHealth

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes


class ServerMetrics:
    """The registry behind ``/metrics``, labelled with the served model name."""

    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.registry = CollectorRegistry()
        self.series = Series(self.registry, model_name, engine)
        self.vllm = VLLMFamilies(self.series)
        self.kvscope = KVScopeFamilies(self.series)
        self.residency = BlockResidency()
        self._config: Callable[[], dict[str, Any]] = dict
        self._run_started = False
        # the hub counts these itself
        self.dropped_steps = self.kvscope.dropped_steps
        self.errors = self.kvscope.errors
        self.slow_client_closes = self.kvscope.slow_client_closes
        self.throttled_seconds = self.kvscope.throttled_seconds

    @property
    def model_name(self) -> str:
        return self.series.model_name

    def watch_hub(self, connections: Callable[[], int], outbox_max: Callable[[], int],
                  outbox_max_bytes: Callable[[], int] = lambda: 0) -> None:
        """Gauges read at scrape time from the hub."""
        self.kvscope.watch_hub(connections, outbox_max, outbox_max_bytes)

    def watch_recorder(self, health: Callable[[], RecorderHealth]) -> None:
        """The recorder's figures, read at scrape time from ``Recorder.health``."""
        self.registry.register(_RecorderCollector(health, self.series))

    def watch_faults(self, faults: Callable[[], StepFaults]) -> None:
        """Engine steps that raised, read at scrape time from the health board."""
        self.registry.register(_FaultCollector(faults, self.series))

    def watch_config(self, config: Callable[[], dict[str, Any]]) -> None:
        """The current run's effective config (empty while loading), read when needed."""
        self._config = config
        self.kvscope.watch_config(config)

    def start_run(self, config: dict[str, Any]) -> None:
        """A new run (first load or restart) with this effective config (``LLMEngine.describe()``)."""
        self.vllm.start_run(config)
        self.residency.reset(bool(config.get("enable_prefix_caching", True)))
        self._run_started = True

    def _ensure_run(self) -> None:
        if not self._run_started:
            config = self._config()
            if config.get("max_model_len"):
                self.start_run(config)

    def observe_step(self, record: StepRecord) -> None:
        """Fold one published step (its events and its metrics dict, see
        engine.events.metrics.step_metrics)."""
        self._ensure_run()
        tenures = self.residency.observe(record.events, record.ts)
        self.vllm.observe(record.metrics, tenures)
        self.kvscope.observe(record.metrics, record.events)

    def render(self) -> bytes:
        self._ensure_run()
        return generate_latest(self.registry)


class _RecorderCollector:
    """``kvscope_recorder_*``: totals the recorder keeps itself (so they never reset
    with an engine restart), exposed as counters; backlog and liveness as gauges."""

    def __init__(self, health: Callable[[], RecorderHealth], series: Series) -> None:
        self.health = health
        self.series = series

    def collect(self):
        h = self.health()
        names, values = ["model_name", "engine"], [self.series.model_name, self.series.engine]
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
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            yield family
        for name, doc, value in (
                ("kvscope_recorder_backlog_steps", "Steps queued or held for a retry, not yet committed.",
                 h.backlog_steps),
                ("kvscope_recorder_up", "1 while the recorder's writer runs and writes succeed, else 0.",
                 int(h.alive and h.fault is None))):
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            yield family


class _FaultCollector:
    """``kvscope_engine_step_failures`` and ``..._failed_requests``: steps that raised, and
    the requests they failed (each fails only its own; the engine keeps serving)."""

    def __init__(self, faults: Callable[[], StepFaults], series: Series) -> None:
        self.faults = faults
        self.series = series

    def collect(self):
        f = self.faults()
        for name, doc, value in (
                ("kvscope_engine_step_failures", "Engine steps that raised; each failed only the "
                 "requests it held.", f.steps),
                ("kvscope_engine_failed_requests", "Requests failed by an engine step that raised.",
                 f.requests)):
            family = CounterMetricFamily(name, doc, labels=["model_name", "engine"])
            family.add_metric(list(self.series.values), value)
            yield family

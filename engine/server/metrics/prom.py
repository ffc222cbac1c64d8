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

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.events.metrics.block_residency import BlockResidency
from engine.events.schema.step import StepRecord
from engine.server.worker.health import StepFaults
from engine.server.metrics.kvscope_families import KVScopeFamilies
from engine.server.metrics.series import LABEL_NAMES, Series
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
        # the hub's figures (it counts drops, errors, closes and throttling itself)
        s = self.series
        self.connections = s.one(Gauge, "kvscope_ws_connections", "Open websocket connections.")
        self.dropped_steps = s.one(Counter, "kvscope_ws_dropped_step_messages",
                                   "Step messages dropped for slow clients (they resync).")
        self.errors = s.by(Counter, "kvscope_ws_errors", "Error messages sent, by code.", "code", ())
        self.outbox_max = s.one(Gauge, "kvscope_ws_outbox_max_step_messages",
                                "Largest queue of unsent step messages over connected clients.")
        self.outbox_max_bytes = s.one(Gauge, "kvscope_ws_outbox_max_bytes",
                                      "Largest unsent bytes (replies and steps) over connected clients.")
        self.slow_client_closes = s.one(Counter, "kvscope_ws_slow_client_closes",
                                        "Connections closed (1008 slow_client) for leaving more than "
                                        "the outbox bound unread.")
        self.throttled_seconds = s.one(Counter, "kvscope_ws_throttled_seconds",
                                       "Seconds websocket connections were not read because they "
                                       "sent past their frame or byte rate.")

    @property
    def model_name(self) -> str:
        return self.series.model_name

    def watch_hub(self, connections: Callable[[], int], outbox_max: Callable[[], int],
                  outbox_max_bytes: Callable[[], int] = lambda: 0) -> None:
        """Gauges read at scrape time from the hub."""
        self.connections.set_function(connections)
        self.outbox_max.set_function(outbox_max)
        self.outbox_max_bytes.set_function(outbox_max_bytes)

    def watch_recorder(self, health: Callable[[], RecorderHealth]) -> None:
        """The recorder's figures, read at scrape time from ``Recorder.health``."""
        self.registry.register(_ReadAtScrape(health, _RECORDER_FAMILIES, self.series))

    def watch_faults(self, faults: Callable[[], StepFaults]) -> None:
        """Engine steps that raised, read at scrape time from the health board."""
        self.registry.register(_ReadAtScrape(faults, _FAULT_FAMILIES, self.series))

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


class _ReadAtScrape:
    """Families whose values live elsewhere and are read at scrape time: one
    ``(family type, name, help, value of the source)`` per family."""

    def __init__(self, source: Callable[[], Any], families: tuple, series: Series) -> None:
        self.source = source
        self.families = families
        self.series = series

    def collect(self):
        source = self.source()
        for family_type, name, doc, value_of in self.families:
            family = family_type(name, doc, labels=list(LABEL_NAMES))
            family.add_metric(list(self.series.values), value_of(source))
            yield family


# ``kvscope_recorder_*``: totals the recorder keeps itself (so they never reset with an
# engine restart), exposed as counters; backlog and liveness as gauges.
_RECORDER_FAMILIES = (
    (CounterMetricFamily, "kvscope_recorder_errors", "Failed recorder write attempts (database faults).",
     lambda h: h.errors_total),
    (CounterMetricFamily, "kvscope_recorder_dropped_steps", "Steps dropped: the backlog passed its bound "
     "while the database failed (marked in the run).", lambda h: h.dropped_steps_total),
    (CounterMetricFamily, "kvscope_recorder_dropped_requests", "Finished requests' rows dropped the same way.",
     lambda h: h.dropped_requests_total),
    (CounterMetricFamily, "kvscope_recorder_skipped_rows", "Rows the database could never store, skipped.",
     lambda h: h.skipped_rows_total),
    (CounterMetricFamily, "kvscope_recorder_written_rows", "Rows the recorder committed.",
     lambda h: h.written_rows_total),
    (GaugeMetricFamily, "kvscope_recorder_backlog_steps", "Steps queued or held for a retry, not yet committed.",
     lambda h: h.backlog_steps),
    (GaugeMetricFamily, "kvscope_recorder_up", "1 while the recorder's writer runs and writes succeed, else 0.",
     lambda h: int(h.alive and h.fault is None)),
)
# Steps that raised, and the requests they failed (each fails only its own; the engine keeps serving).
_FAULT_FAMILIES = (
    (CounterMetricFamily, "kvscope_engine_step_failures", "Engine steps that raised; each failed only the "
     "requests it held.", lambda f: f.steps),
    (CounterMetricFamily, "kvscope_engine_failed_requests", "Requests failed by an engine step that raised.",
     lambda f: f.requests),
)

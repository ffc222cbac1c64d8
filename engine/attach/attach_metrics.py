"""AttachMetrics: ``/metrics`` of ``kvscope attach``, about the attachment itself.

An attached run's steps are a foreign engine's cache events, so none of vLLM's
``vllm:*`` figures are derived from them (the deployment exports its own; attach
scrapes them). What is exported, labelled ``pod``:

- ``kvscope_attach_batches_total``, ``kvscope_attach_replayed_batches_total``,
  ``kvscope_attach_bad_messages_total`` (counters kept by each subscription);
- ``kvscope_attach_cached_blocks``, ``kvscope_attach_holes`` (gauges from the fold);
- the websocket and recorder figures every kvscope server has:
  ``kvscope_steps_total``, ``kvscope_ws_connections``, ``kvscope_ws_dropped_step_messages_total``,
  ``kvscope_ws_errors_total{code}``, ``kvscope_recorder_up``, ``kvscope_recorder_backlog_steps``.

Writer: the hub calls ``observe_step`` on the loop thread; the collectors read the
subscriptions' and the worker's counters at scrape time (single attribute reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.events.schema.step import StepRecord
from engine.store.recorder_health import RecorderHealth


class AttachMetrics:
    def __init__(self, label: str) -> None:
        self.label = label
        r = self.registry = CollectorRegistry()
        self.steps = Counter("kvscope_steps", "Steps published (one per received batch, hole or segment).",
                             registry=r)
        self.connections = Gauge("kvscope_ws_connections", "Open websocket connections.", registry=r)
        self.outbox_max = Gauge("kvscope_ws_outbox_max_step_messages",
                                "Largest queue of unsent step messages over connected clients.", registry=r)
        self.dropped_steps = Counter("kvscope_ws_dropped_step_messages",
                                     "Step messages dropped for slow clients (they resync).", registry=r)
        self.errors = Counter("kvscope_ws_errors", "Error messages sent, by code.", ["code"], registry=r)
        self.slow_client_closes = Counter("kvscope_ws_slow_client_closes",
                                          "Connections closed (1008 slow_client) for leaving more than "
                                          "the outbox bound unread.", registry=r)
        self.throttled_seconds = Counter("kvscope_ws_throttled_seconds",
                                         "Seconds websocket connections were not read because they "
                                         "sent past their frame or byte rate.", registry=r)
        self.outbox_max_bytes = Gauge("kvscope_ws_outbox_max_bytes",
                                      "Largest outbox in bytes over connected clients.", registry=r)

    def watch_hub(self, connections: Callable[[], int], outbox_max: Callable[[], int],
                  outbox_max_bytes: Callable[[], int] = lambda: 0) -> None:
        self.connections.set_function(connections)
        self.outbox_max.set_function(outbox_max)
        self.outbox_max_bytes.set_function(outbox_max_bytes)

    def watch_recorder(self, health: Callable[[], RecorderHealth]) -> None:
        up = Gauge("kvscope_recorder_up", "1 while the recorder's writer runs and writes succeed.",
                   registry=self.registry)
        backlog = Gauge("kvscope_recorder_backlog_steps", "Steps queued, not yet committed.",
                        registry=self.registry)
        up.set_function(lambda: int((h := health()).alive and h.fault is None))
        backlog.set_function(lambda: health().backlog_steps)

    def watch_attach(self, subscriptions: Callable[[], list[Any]],
                     counts: Callable[[], dict[str, dict[str, int]]]) -> None:
        self.registry.register(_AttachCollector(subscriptions, counts))

    def start_run(self, config: dict[str, Any]) -> None:
        pass  # one run per attach process: nothing restarts

    def observe_step(self, record: StepRecord) -> None:
        self.steps.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _AttachCollector:
    def __init__(self, subscriptions: Callable[[], list[Any]],
                 counts: Callable[[], dict[str, dict[str, int]]]) -> None:
        self.subscriptions, self.counts = subscriptions, counts

    def collect(self):
        subs = self.subscriptions()
        for name, doc, attr in (("kvscope_attach_batches", "Batches received (live or replayed).", "received"),
                                ("kvscope_attach_replayed_batches", "Batches filled through replay.", "replayed"),
                                ("kvscope_attach_bad_messages", "Messages that were not KV event batches.",
                                 "bad_messages")):
            fam = CounterMetricFamily(name, doc, labels=["pod"])
            for sub in subs:
                fam.add_metric([sub.source.pod], getattr(sub, attr))
            yield fam
        counts = self.counts()
        for name, doc, key in (("kvscope_attach_cached_blocks", "Blocks the stream says are cached.",
                                "cached_blocks"),
                               ("kvscope_attach_holes", "Holes: batches that never arrived.", "holes")):
            fam = GaugeMetricFamily(name, doc, labels=["pod"])
            for pod, c in counts.items():
                fam.add_metric([pod], c.get(key, 0))
            yield fam

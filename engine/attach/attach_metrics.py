"""AttachMetrics: ``/metrics`` of ``kvscope attach``, about the attachment itself.

An attached run's steps are a foreign engine's cache events, so none of vLLM's
``vllm:*`` figures are derived from them (the deployment exports its own; attach
scrapes them). What is exported, labelled ``pod``:

- ``kvscope_attach_batches_total``, ``kvscope_attach_replayed_batches_total``,
  ``kvscope_attach_bad_messages_total`` (counters kept by each subscription);
- ``kvscope_attach_cached_blocks``, ``kvscope_attach_holes`` (gauges from the fold);
- from each pod's fleet row (``engine.attach.fleet``), so the fleet view lands in Grafana too:
  churn (``kvscope_attach_evicted_blocks_total``, ``..._evicted_before_reuse_blocks_total``,
  ``..._evicted_blocks_per_minute``), index fidelity (``kvscope_attach_completeness_ratio``,
  ``..._lost_batches_total``, ``..._gaps_total``, ``..._gaps_filled_total``,
  ``..._restarts_total``, ``..._duplicate_batches_total``, ``..._duplicate_stores_total``,
  ``..._placeholder_stores_total``, ``..._unknown_removals_total``, ``..._dialect_info`` with
  the latest batch's ``events``, ``hashes``, ``frames``, ``fields``), the age of the latest
  batch (``kvscope_attach_last_batch_age_seconds``), achieved against reachable hits
  (``kvscope_attach_placed_blocks_total``, ``..._achieved_blocks_total``,
  ``..._reachable_blocks_total``) and the prefix locator's answers
  (``kvscope_attach_locate_queries_total``), the miss explainer's tokens by cause
  (``kvscope_attach_miss_tokens_total{pod, cause, source}``, source ``events`` or ``probes``);
- what each routing policy would have done with the requests seen
  (``engine.attach.policy_replay``, labelled ``policy``): ``kvscope_attach_policy_hit_blocks_total``
  beside ``kvscope_attach_policy_blocks_total`` (the requests' blocks, one series);
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
                     counts: Callable[[], dict[str, dict[str, int]]],
                     fleet: Callable[[], tuple[dict[str, dict[str, Any]], dict[str, int]]] = lambda: ({}, {}),
                     policies: Callable[[], dict[str, Any]] = dict) -> None:
        """``fleet()``: (each pod's fleet row, each pod's locator answers); ``policies()``: the
        policy replay's latest ``summary()``."""
        self.registry.register(_AttachCollector(subscriptions, counts))
        self.registry.register(_FleetCollector(fleet))
        self.registry.register(_PolicyCollector(policies))

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


_FLEET_COUNTERS = (  # (name, help, the row's key)
    ("kvscope_attach_evicted_blocks", "Blocks evicted: the last copy of a hash removed (clears and "
     "restarts apart).", "evicted_blocks"),
    ("kvscope_attach_evicted_before_reuse_blocks", "Evicted blocks no second store or branch ever "
     "reused (an upper bound: hits that store nothing are invisible).", "evicted_before_reuse"),
    ("kvscope_attach_lost_batches", "Batches lost in holes (never arrived, not in replay, or undecodable).",
     "lost_batches"),
    ("kvscope_attach_gaps", "Sequence gaps seen in the live stream.", "gaps"),
    ("kvscope_attach_gaps_filled", "Sequence gaps filled whole through replay.", "gaps_filled"),
    ("kvscope_attach_restarts", "Publisher restarts (seq back to 0).", "restarts"),
    ("kvscope_attach_duplicate_batches", "Batches received twice (a replay overlapping the live stream).",
     "duplicate_batches"),
    ("kvscope_attach_duplicate_stores", "Stores of a hash already cached (recomputed copies).",
     "duplicate_stores"),
    ("kvscope_attach_placeholder_stores", "Hash-only stores (an offload tier's placeholders).",
     "placeholder_stores"),
    ("kvscope_attach_unknown_removals", "Removals of hashes never seen stored.", "unknown_removals"),
    ("kvscope_attach_placed_blocks", "Prompt blocks of the requests seen starting or branching on the pod.",
     "placed_blocks"),
    ("kvscope_attach_achieved_blocks", "Of those, blocks the pod already held (its hit).", "achieved_blocks"),
    ("kvscope_attach_reachable_blocks", "Of those, the most any pod held then (the best placement's hit).",
     "reachable_blocks"),
)


class _FleetCollector:
    def __init__(self, fleet: Callable[[], tuple[dict[str, dict[str, Any]], dict[str, int]]]) -> None:
        self.fleet = fleet

    def collect(self):
        import time

        rows, queries = self.fleet()
        for name, doc, key in _FLEET_COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=["pod"])
            for pod, r in rows.items():
                fam.add_metric([pod], r.get(key) or 0)
            yield fam
        per_min = GaugeMetricFamily("kvscope_attach_evicted_blocks_per_minute",
                                    "Blocks evicted in the last 60 s of the pod's clock, per minute.",
                                    labels=["pod"])
        complete = GaugeMetricFamily("kvscope_attach_completeness_ratio",
                                     "Batches applied / (applied + lost), 0..1 (absent before any).",
                                     labels=["pod"])
        age = GaugeMetricFamily("kvscope_attach_last_batch_age_seconds",
                                "Seconds since the pod's latest batch arrived (absent before any).",
                                labels=["pod"])
        info = GaugeMetricFamily("kvscope_attach_dialect_info", "The dialect of the pod's latest batch.",
                                 labels=["pod", "events", "hashes", "frames", "fields"])
        now = time.time()
        for pod, r in rows.items():
            per_min.add_metric([pod], r.get("evicted_per_min") or 0.0)
            if r.get("completeness") is not None:
                complete.add_metric([pod], r["completeness"])
            if r.get("last_batch_wall") is not None:
                age.add_metric([pod], max(0.0, now - r["last_batch_wall"]))
            d = r.get("dialect") or {}
            if d and "error" not in d:
                info.add_metric([pod, str(d.get("events")), str(d.get("hashes")), str(d.get("frames")),
                                 str(d.get("fields"))], 1)
        yield from (per_min, complete, age, info)
        fam = CounterMetricFamily("kvscope_attach_locate_queries", "Prefix locator answers given, per pod.",
                                  labels=["pod"])
        for pod, n in queries.items():
            fam.add_metric([pod], n)
        yield fam
        fam = CounterMetricFamily("kvscope_attach_miss_tokens", "Missed prompt tokens by cause: of the "
                                  "requests seen in the events, or of the locator's probes.",
                                  labels=["pod", "cause", "source"])
        for pod, r in rows.items():
            for source, key in (("events", "miss_tokens"), ("probes", "probe_misses")):
                for cause, n in sorted((r.get(key) or {}).items()):
                    fam.add_metric([pod, cause, source], n)
        yield fam


class _PolicyCollector:
    def __init__(self, policies: Callable[[], dict[str, Any]]) -> None:
        self.policies = policies

    def collect(self):
        s = self.policies() or {}
        blocks = CounterMetricFamily("kvscope_attach_policy_blocks", "Prompt blocks of the requests seen "
                                     "(the policy replay's denominator).")
        hits = CounterMetricFamily("kvscope_attach_policy_hit_blocks", "Of those, the blocks each routing "
                                   "policy's replayed pod held (its hit).", labels=["policy"])
        if s:
            blocks.add_metric([], s.get("blocks", 0))
            for name, p in (s.get("policies") or {}).items():
                hits.add_metric([name], p.get("hit_blocks", 0))
        yield blocks
        yield hits

"""AttachServer: ``kvscope attach`` as a server the dashboard connects to like an engine.

The same front door as ``kvscope serve`` (``engine.server.port.front_door``: the websocket hub,
``steps_since`` from the step history and the recording, ``/healthz``,
``/metrics``), with an ``AttachWorker`` in the engine thread's place, one
``PodSubscription`` per pod and one ``Scraper`` per pod given ``metrics``.

Shutdown (``stop()``, SIGINT, SIGTERM): stop scraping; stop each subscription,
which hands over everything its socket had received; the worker makes steps of
all of it and finishes the run; connections close (1001); the recorder flushes.

    server = AttachServer(AttachOptions((PodSource("a", "tcp://127.0.0.1:5557"),), port=0)).start()
    print(server.url); ...; server.stop()
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass
from typing import Any

from starlette.routing import BaseRoute

from engine.attach.attach_metrics import AttachMetrics
from engine.attach.pod_source import PodSource
from engine.attach.routes import AttachRoutes
from engine.attach.scraper import Scraper
from engine.attach.stream_items import StreamItem
from engine.attach.subscription import PodSubscription
from engine.attach.worker import AttachWorker
from engine.core.errors import ConfigError
from engine.server.port.front_door import FrontDoor, Post
from engine.server.worker.health import HealthBoard
from engine.server.websocket.hub import HubLimits
from engine.server.worker.mailbox import Shutdown
from engine.server.port.security import check_allowed_hosts, check_bind

DEFAULT_PORT = 8766  # next to kvscope serve's 8765: both run on one laptop in the walk-through
MAX_QUEUED_ITEMS = 100_000  # stream items between the subscriptions and the worker


@dataclass(frozen=True, slots=True)
class AttachOptions:
    pods: tuple[PodSource, ...]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: str | None = None
    record: bool = True
    label: str | None = None
    allow_remote: bool = False
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host (engine.server.port.security.HostPolicy)
    tokenizer_file: str | None = None
    scrape_interval_s: float = 1.0
    step_buffer: int = 256
    step_history: int = 1024
    max_frame_bytes: int = 1 << 20
    ping_interval: float | None = 20.0

    def __post_init__(self) -> None:
        if not self.pods:
            raise ConfigError("attach needs at least one --kv-events endpoint")
        names = [p.pod for p in self.pods]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"pod names must differ; {', '.join(map(repr, dup))} is given twice "
                              f"(name each with --pod)")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in 0..65535, got {self.port!r}")
        if self.scrape_interval_s <= 0:
            raise ConfigError(f"the scrape interval must be > 0, got {self.scrape_interval_s}")
        check_bind(self.host, self.allow_remote, self.token)
        object.__setattr__(self, "allowed_hosts", check_allowed_hosts(self.allowed_hosts))

    def run_config(self) -> dict[str, Any]:
        """What the run records as its config and every hello carries."""
        return {"kind": "attached", "model_name": self.label or "attached deployment",
                "pods": [p.to_dict() for p in self.pods], "tokenizer_file": self.tokenizer_file,
                "scrape_interval_s": self.scrape_interval_s}


class AttachServer(FrontDoor):
    def __init__(self, options: AttachOptions) -> None:
        super().__init__(host=options.host, port=options.port, db=options.db, record=options.record,
                         token=options.token, ping_interval=options.ping_interval,
                         limits=HubLimits(options.max_frame_bytes, options.step_buffer,
                                          options.step_history),
                         max_pending_ops=1024, board=HealthBoard("attach"),
                         allowed_hosts=options.allowed_hosts,
                         metrics=AttachMetrics(options.label or "attached deployment"))
        self.options = options
        self.items: queue.Queue[StreamItem] = queue.Queue(MAX_QUEUED_ITEMS)
        self.subscriptions: list[PodSubscription] = []
        self.scrapers: dict[str, Scraper] = {}
        self.worker: AttachWorker | None = None
        self.metrics.watch_attach(lambda: self.subscriptions,
                                  lambda: {} if self.worker is None else self.worker.counts,
                                  lambda: ({}, {}) if self.worker is None else
                                  (self.worker.fleet, dict(self.worker.locate_queries)),
                                  lambda: {} if self.worker is None else self.worker.policy_summary)

    @property
    def run_id(self) -> str | None:
        return None if self.worker is None else self.worker.run_id

    def _prepare(self) -> None:
        for p in self.options.pods:  # a bad endpoint fails the start, before anything is recorded
            self.subscriptions.append(PodSubscription(p, self.items, allow_remote=self.options.allow_remote))

    def _abandon(self) -> None:
        for sub in self.subscriptions:
            sub.sub.close(0)

    def _wire_counters(self, pod: str) -> dict[str, Any]:
        sub = next((s for s in self.subscriptions if s.source.pod == pod), None)
        return {} if sub is None else sub.counters()

    def _routes(self) -> list[BaseRoute]:
        return AttachRoutes(self.gate, lambda: self.worker, self.options.tokenizer_file,
                            lambda: self.subscriptions).routes()

    def _extra_health(self) -> dict[str, Any]:
        return {"kind": "attached", "pods": [p.pod for p in self.options.pods]}

    def _describe(self) -> str:
        return f"attach serving {self.url} ({len(self.options.pods)} pod(s))"

    def _start_work(self, post: Post) -> None:
        opts = self.options
        self.scrapers = {p.pod: Scraper(p.pod, p.metrics, opts.scrape_interval_s)
                         for p in opts.pods if p.metrics is not None}
        self.worker = AttachWorker(opts.pods, self.items, post, self.mailbox, self.board,
                                   opts.run_config(), self.recorder, opts.label, self.scrapers,
                                   {"max_frame_bytes": opts.max_frame_bytes,
                                    "step_buffer": opts.step_buffer, "read_only": True},
                                   wire_counters=self._wire_counters)
        self.worker.start()
        for t in (*self.scrapers.values(), *self.subscriptions):
            t.start()

    async def _stop_work(self) -> None:
        for s in self.scrapers.values():
            s.stop()
        for sub in self.subscriptions:
            sub.stop()
        for sub in self.subscriptions:  # each hands over what its socket holds, then ends
            if sub.is_alive():
                await asyncio.to_thread(sub.join, 10.0)
        if self.worker is not None:
            self.mailbox.send_lifecycle(None, Shutdown())
            await asyncio.to_thread(self.worker.join, 30.0)

"""An engine thread with no websocket in front: tests send protocol ops into its mailbox
with their own Sinks (what a second front door does) and apply its deliveries here."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.outputs import RequestOutput
from engine.server.worker.engine_loop import EngineWorker
from engine.server.worker.health import HealthBoard, Status
from engine.server.worker.mailbox import Delivery, Mailbox, Reply, Shutdown
from engine.server.worker.sink import Sink, Source
from tests.server.conftest import ENGINE


class ListSink(Sink):
    """What an HTTP request's handler would hold: the answers, in order."""

    source = Source.OPENAI

    def __init__(self, sink_id: int) -> None:
        self.id = sink_id
        self.items: list = []

    def deliver(self, item) -> None:
        self.items.append(item)

    def outputs(self, rid: str) -> list[RequestOutput]:
        return [i for i in self.items if isinstance(i, RequestOutput) and i.request_id == rid]

    def finished(self, rid: str) -> RequestOutput | None:
        return next((o for o in self.outputs(rid) if o.finished), None)


@dataclass
class Door:
    mailbox: Mailbox
    worker: EngineWorker
    board: HealthBoard
    batches: queue.SimpleQueue
    seen: list[Delivery] = field(default_factory=list)

    def sink(self) -> ListSink:
        return ListSink(self.mailbox.new_sink_id())

    def pump(self, done, timeout: float = 30.0) -> None:
        """Apply deliveries (in order) until ``done()``."""
        deadline = time.monotonic() + timeout
        while not done():
            batch = self.batches.get(timeout=max(0.01, deadline - time.monotonic()))
            for d in batch:
                self.seen.append(d)
                if isinstance(d, Reply):
                    d.sink.deliver(d.item)


@pytest.fixture
def make_door(tiny_llama):
    doors: list[Door] = []

    def make(engine: dict[str, Any] | None = None, **worker_options) -> Door:
        mailbox, batches, board = Mailbox(64), queue.SimpleQueue(), HealthBoard("llama")
        cfg = EngineConfig(**{"model": tiny_llama, **ENGINE, **(engine or {})})
        worker = EngineWorker(cfg, batches.put, mailbox, board, **worker_options)
        worker.start()
        doors.append(Door(mailbox, worker, board, batches))
        deadline = time.monotonic() + 60
        while board.current.status is Status.LOADING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert board.current.status is Status.READY
        return doors[-1]

    yield make
    for d in doors:
        d.mailbox.send_lifecycle(None, Shutdown())
        d.worker.join(30)
        assert not d.worker.is_alive()


@pytest.fixture
def door(make_door) -> Door:
    """An engine thread and its mailbox, with deliveries applied on this thread."""
    return make_door()

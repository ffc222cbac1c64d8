"""Running ``AttachServer`` in-process against fake publishers, and reading what it made."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.attach.pod_source import PodSource
from engine.attach.server import AttachOptions, AttachServer
from engine.events.schema.types import KVBlockRemoved, KVBlockStored, KVGap, KVSegment
from engine.store.runs import RunStore
from tests.attach.fake_publisher import FakePublisher


def source(pub: FakePublisher, pod: str = "pod-a", replay: bool = True, **kw: Any) -> PodSource:
    return PodSource(pod, pub.endpoint, pub.replay_endpoint if replay else None,
                     pub.topic.decode(), **kw)


def start_attach(tmp_path, *pods: PodSource, **kw: Any) -> AttachServer:
    kw.setdefault("db", str(tmp_path / "runs.sqlite"))
    server = AttachServer(AttachOptions(tuple(pods), port=0, ping_interval=None, **kw)).start()
    for sub in server.subscriptions:  # the history replay is done: what follows arrives live
        assert sub.caught_up.wait(10), f"pod {sub.source.pod} did not catch up"
    return server


def wait_until(pred: Callable[[], Any], timeout: float = 15.0, what: str = "the condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def cached(server: AttachServer, pod: str = "pod-a") -> set[str]:
    return server.worker.state.cached(pod)


def steps_of(server: AttachServer) -> int:
    return server.worker.num_steps


def recorded(server: AttachServer) -> tuple[dict, list]:
    """(run row, step records) of the server's run, once it has stopped."""
    store = RunStore(server.options.db)
    return store.get_run(server.run_id), store.load_steps(server.run_id)


def kinds(records: list) -> list[str]:
    return [e.type for r in records for e in r.events]


def events_of(records: list, cls: type) -> list:
    return [e for r in records for e in r.events if isinstance(e, cls)]


__all__ = ["KVBlockRemoved", "KVBlockStored", "KVGap", "KVSegment", "cached", "events_of", "kinds",
           "recorded", "source", "start_attach", "steps_of", "wait_until"]

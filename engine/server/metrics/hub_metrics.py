"""HubMetrics: what the front door asks of the registry behind ``/metrics``.

``ServerMetrics`` (``engine.server.metrics.prom``: vLLM's names, fed from engine steps) is
the one ``kvscope serve`` uses; ``kvscope attach`` has its own
(``engine.attach.attach_metrics``), because an attached run's steps are a foreign
engine's cache events, not an engine's work, and must not read as vLLM figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine.events.schema.step import StepRecord
from engine.store.recorder_health import RecorderHealth


class HubMetrics(Protocol):
    dropped_steps: Any  # a prometheus Counter: step messages dropped for slow clients
    errors: Any  # a prometheus Counter labelled by error code
    slow_client_closes: Any  # a prometheus Counter: connections closed 1008 slow_client
    throttled_seconds: Any  # a prometheus Counter: time connections were not read (frame rate)

    def watch_hub(self, connections: Callable[[], int], outbox_max: Callable[[], int],
                  outbox_max_bytes: Callable[[], int] = ...) -> None: ...

    def watch_recorder(self, health: Callable[[], RecorderHealth]) -> None: ...

    def start_run(self, config: dict[str, Any]) -> None: ...

    def observe_step(self, record: StepRecord) -> None: ...

    def render(self) -> bytes: ...

"""Server health: loading → ready (or error) → stopping, as ``/healthz`` reports it.

Writer: the engine thread (it loads the model and owns the run). Readers (the
HTTP handler on the event-loop thread) read ``HealthBoard.current``, an
immutable ``Health`` swapped in whole, so a reader never sees half an update.
A ready server whose recorder is down, failing or behind reads as ``degraded``
(still serving; ``detail`` says why): ``current`` joins the engine's Health with
the recorder's own snapshot at read time (``engine.store.recorder_problem``).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.store.recorder_health import RecorderHealth, recorder_problem


class Status(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DEGRADED = "degraded"  # ready and serving, but the recorder is down, failing or behind
    ERROR = "error"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class Health:
    status: Status
    detail: str = ""
    run_id: str | None = None
    model: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    recorder: RecorderHealth | None = None  # None when the server does not record
    faults: StepFaults | None = None  # engine steps that raised (their requests failed)

    @property
    def serving(self) -> bool:
        return self.status in (Status.READY, Status.DEGRADED)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status.value, "detail": self.detail}
        if self.serving:
            d.update(run_id=self.run_id, model=self.model,
                     num_blocks=self.config.get("num_blocks"),
                     block_size=self.config.get("block_size"),
                     max_model_len=self.config.get("max_model_len"))
        if self.recorder is not None:
            d["recorder"] = self.recorder.to_dict()
        if self.faults is not None:
            d["step_failures"] = self.faults.to_dict()
        return d


@dataclass(frozen=True, slots=True)
class StepFaults:
    """Engine steps that raised since the server started (across restarts): each failed
    only the requests it held, and the engine kept serving (``EngineWorker._step``)."""

    steps: int = 0
    requests: int = 0
    last: str = ""  # the last fault, as ``Type: message``
    last_at: float = 0.0  # unix time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HealthBoard:
    """Holds the current Health; ``set``/``note`` are called by the engine thread only."""

    def __init__(self, model: str) -> None:
        self._engine = Health(Status.LOADING, f"loading {model}", model=model)
        self._recorder: Callable[[], RecorderHealth] | None = None
        self.faults = StepFaults()
        self.started = time.time()

    @property
    def current(self) -> Health:
        """The engine's Health, with the recorder's snapshot (degraded if it has a problem)."""
        health, source = self._engine, self._recorder
        if self.faults.steps:
            health = replace(health, faults=self.faults)
        if source is None:
            return health
        rec = source()
        problem = recorder_problem(rec) if health.status is Status.READY else None
        if problem is not None:
            return replace(health, status=Status.DEGRADED, detail=problem, recorder=rec)
        return replace(health, recorder=rec)

    def watch_recorder(self, source: Callable[[], RecorderHealth]) -> None:
        """Read the recorder's health (``Recorder.health``) into every ``current``."""
        self._recorder = source

    def set(self, health: Health) -> None:
        self._engine = health

    def note_step_failure(self, detail: str, num_requests: int) -> None:
        """Count a step that raised and failed ``num_requests`` requests."""
        f = self.faults
        self.faults = StepFaults(f.steps + 1, f.requests + num_requests, detail[:500], time.time())

    def note(self, line: str) -> None:
        """A progress line while loading (shown as ``detail``)."""
        if self._engine.status is Status.LOADING:
            self._engine = replace(self._engine, detail=line)

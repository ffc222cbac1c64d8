"""Server health: loading → ready (or error) → stopping, as ``/healthz`` reports it.

Writer: the engine thread (it loads the model and owns the run). Readers (the
HTTP handler on the event-loop thread) read ``HealthBoard.current``, an
immutable ``Health`` swapped in whole, so a reader never sees half an update.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any


class Status(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class Health:
    status: Status
    detail: str = ""
    run_id: str | None = None
    model: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status.value, "detail": self.detail}
        if self.status is Status.READY:
            d.update(run_id=self.run_id, model=self.model,
                     num_blocks=self.config.get("num_blocks"),
                     block_size=self.config.get("block_size"),
                     max_model_len=self.config.get("max_model_len"))
        return d


class HealthBoard:
    """Holds the current Health; ``set``/``note`` are called by the engine thread only."""

    def __init__(self, model: str) -> None:
        self.current = Health(Status.LOADING, f"loading {model}", model=model)
        self.started = time.time()

    def set(self, health: Health) -> None:
        self.current = health

    def note(self, line: str) -> None:
        """A progress line while loading (shown as ``detail``)."""
        if self.current.status is Status.LOADING:
            self.current = replace(self.current, detail=line)


class ProgressCapture(logging.Handler):
    """Feeds INFO+ lines of the ``engine`` loggers (model loading, KV sizing) to the
    board while the model loads, so ``/healthz`` shows what is happening."""

    def __init__(self, board: HealthBoard) -> None:
        super().__init__(logging.INFO)
        self.board = board
        self._logger = logging.getLogger("engine")
        self._old_level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.board.note(record.getMessage())
        except Exception:  # a progress line is never worth failing a load
            pass

    def __enter__(self) -> ProgressCapture:
        self._logger.addHandler(self)
        # INFO records are only created if the logger lets them through; lower it
        # for the load only (and restore it), or an unconfigured process shows nothing.
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)

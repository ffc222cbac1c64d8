"""ProgressCapture: the model load's log lines, handed to whoever shows them.

INFO+ lines of the ``engine`` loggers (model loading, KV sizing) go to ``note`` while
the core is built: the worker's health board in the serving process (``/healthz``
shows what is happening), or the pipe to the engine in the core's own process
(``engine.engine_core.process`` sends each to the engine).
"""

from __future__ import annotations

import logging
from collections.abc import Callable


class ProgressCapture(logging.Handler):
    def __init__(self, note: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.note = note
        self._logger = logging.getLogger("engine")
        self._old_level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.note(record.getMessage())
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

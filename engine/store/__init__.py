"""Recording runs to SQLite and reading them back (sqlite-utils).

``Recorder`` writes (engine side, off the hot path) and reports ``RecorderHealth``;
``RunStore`` reads, labels, deletes and replays; ``Loss`` marks rows a database
fault cost a run; ``transfer`` exports/imports JSON lines; ``commands`` holds the
``kvscope runs`` / ``kvscope replay`` commands.
"""

from engine.store.loss import Loss
from engine.store.recorder import Recorder
from engine.store.recorder_health import RecorderHealth, recorder_problem
from engine.store.runs import RunStore, StepOutOfRangeError, StepsLostError, UnknownRunError

__all__ = ["Loss", "Recorder", "RecorderHealth", "RunStore", "StepOutOfRangeError",
           "StepsLostError", "UnknownRunError", "recorder_problem"]

"""Recording runs to SQLite and reading them back (sqlite-utils).

``Recorder`` writes (engine side, off the hot path); ``RunStore`` reads, labels,
deletes and replays; ``transfer`` exports/imports JSON lines; ``commands`` holds
the ``kvscope runs`` / ``kvscope replay`` commands.
"""

from engine.store.recorder import Recorder
from engine.store.runs import RunStore, StepOutOfRangeError, UnknownRunError

__all__ = ["Recorder", "RunStore", "StepOutOfRangeError", "UnknownRunError"]

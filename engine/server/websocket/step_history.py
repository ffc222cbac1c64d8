"""StepHistory: the live run's recent steps, and the answer to ``steps_since``.

The hub appends every published step (loop thread). ``answer(op)`` serves the
steps after ``op.seq``: from this buffer, and the older ones (or another run's)
from the run's recording through ``engine.store``, read in a worker thread so the
event loop never waits on SQLite. A client that fell behind (the dashboard's
live feed between two redraws) fills its gap with it instead of reading the
database itself. Steps found in neither place are simply absent: the client
sees the gap in ``seq``.

Writer: the hub, on the loop thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque

from engine.events.schema.step import StepRecord
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error, Steps
from engine.protocol.ops import StepsSince
from engine.store.runs import RunStore, UnknownRunError

MAX_STEPS_PER_REPLY = 512  # ~1-5 KB each: one reply stays a few MB; ``more`` says ask again


class StepHistory:
    def __init__(self, capacity: int = 1024, store: RunStore | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._steps: deque[StepRecord] = deque(maxlen=capacity)
        self.run_id: str | None = None  # the live run
        self.store = store  # None: this server does not record

    def new_run(self, run_id: str | None) -> None:
        self.run_id = run_id
        self._steps.clear()

    def append(self, run_id: str, record: StepRecord) -> None:
        if run_id != self.run_id:
            self.new_run(run_id)
        self._steps.append(record)

    async def answer(self, op: StepsSince) -> Steps | Error:
        run_id = op.run_id or self.run_id
        if run_id == self.run_id:
            buffered = [r for r in self._steps if r.seq > op.seq]
            start = self._steps[0].seq if self._steps else op.seq + 1
            older: list[StepRecord] = []
            if op.seq + 1 < start and self.store is not None:
                try:
                    older = await asyncio.to_thread(self.store.steps_after, run_id, op.seq, start,
                                                    MAX_STEPS_PER_REPLY)
                except (UnknownRunError, OSError, ValueError, sqlite3.Error):
                    older = []  # not (yet) recorded: the client sees the gap
            steps = older + buffered
        elif self.store is None:
            return Error(ErrorCode.UNKNOWN_RUN, f"run {run_id!r} is not the live run and this server "
                         f"does not record runs", op=op.type)
        else:
            try:
                steps = await asyncio.to_thread(self.store.steps_after, run_id, op.seq, None,
                                                MAX_STEPS_PER_REPLY + 1)
            except UnknownRunError:
                return Error(ErrorCode.UNKNOWN_RUN, f"no run {run_id!r} is live or recorded here",
                             op=op.type)
            except (OSError, ValueError, sqlite3.Error) as exc:
                return Error(ErrorCode.INTERNAL, f"the recording cannot be read: {exc}", op=op.type)
        more = len(steps) > MAX_STEPS_PER_REPLY
        return Steps(run_id, op.seq, steps[:MAX_STEPS_PER_REPLY], more)

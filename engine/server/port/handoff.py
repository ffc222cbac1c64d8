"""LoopHandoff: the worker thread's batches into the event loop, one wake-up at a time.

``post(batch)`` is called by the engine (or attach) worker once per step. Waking the
loop costs a ``call_soon_threadsafe`` each: a write to the loop's self-pipe, and the
GIL handed back and forth. While a wake-up is pending the loop has not run yet, so a
new batch is appended to the pending one instead of waking it again; the loop takes
everything pending in one go, in the order it was posted. Under load (the loop behind
a step or two) this turns N wake-ups into one; idle, it is one per batch as before.

Writers: ``post`` (the worker thread) appends; ``_drain`` (the loop) takes. One lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class LoopHandoff(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[list[T]], None]) -> None:
        self._loop = loop
        self._deliver = deliver
        self._lock = threading.Lock()
        self._pending: list[T] = []
        self._woken = False  # a _drain is scheduled and has not taken the pending items yet
        self.wakeups = 0  # how many times the loop was woken (for tests and figures)

    def post(self, batch: list[T]) -> None:
        """Hand ``batch`` to the loop (any thread). Dropped silently once the loop closed."""
        with self._lock:
            self._pending.extend(batch)
            if self._woken:
                return
            self._woken = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
            self.wakeups += 1
        except RuntimeError:
            pass  # the loop has closed: we are past shutdown

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending, self._woken = self._pending, [], False
        if batch:
            self._deliver(batch)

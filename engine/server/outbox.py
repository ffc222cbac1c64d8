"""Outbox: one client's outgoing messages, on the event-loop thread.

Two lanes, so a slow reader never slows the engine or anyone else:
- replies (hello, snapshot, accepted, output, finished, error, ok, pong) are
  never dropped and go first. They are bounded only as a last resort
  (``max_replies``): a client that lets that many pile up is closed.
- step messages are bounded (``max_steps``); when the lane is full the new step
  is dropped and counted. The client then sees a gap in ``seq`` and asks for a
  snapshot; a new snapshot clears the lane, since every queued step is older.

Writer: the Hub (deliveries) and the connection's writer task (``get``), both on
the loop thread, so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Outbox:
    def __init__(self, max_steps: int, max_replies: int) -> None:
        if max_steps < 1 or max_replies < 1:
            raise ValueError("max_steps and max_replies must be >= 1")
        self.max_steps = max_steps
        self.max_replies = max_replies
        self._replies: deque[str] = deque()
        self._steps: deque[str] = deque()
        self._wake = asyncio.Event()
        self.dropped_steps = 0
        self.max_steps_seen = 0  # high-water mark of the step lane (tests and /metrics)
        self.closed = False

    def put_reply(self, frame: str) -> bool:
        """Queue a reply; False when the reply bound is hit (the client must go)."""
        if self.closed or len(self._replies) >= self.max_replies:
            return False
        self._replies.append(frame)
        self._wake.set()
        return True

    def put_step(self, frame: str) -> bool:
        """Queue a step message; False (and counted) when the lane is full."""
        if self.closed:
            return False
        if len(self._steps) >= self.max_steps:
            self.dropped_steps += 1
            return False
        self._steps.append(frame)
        self.max_steps_seen = max(self.max_steps_seen, len(self._steps))
        self._wake.set()
        return True

    def clear_steps(self) -> None:
        """Drop queued steps: a snapshot or a new run that follows supersedes them."""
        self._steps.clear()

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    @property
    def num_replies(self) -> int:
        return len(self._replies)

    async def get(self) -> str:
        """The next frame to send, replies first."""
        while not (self._replies or self._steps):
            self._wake.clear()
            await self._wake.wait()
        return self._replies.popleft() if self._replies else self._steps.popleft()

    def close(self) -> None:
        self.closed = True
        self._replies.clear()
        self._steps.clear()
        self._wake.set()

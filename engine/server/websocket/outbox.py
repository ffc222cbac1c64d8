"""Outbox: one client's outgoing messages, on the event-loop thread, bounded in bytes.

Two lanes, so a slow reader never slows the engine or anyone else:
- replies (hello, snapshot, accepted, output, finished, error, ok, pong) are never
  dropped and go first;
- step messages are bounded (``max_steps``); when the lane is full the new step is
  dropped and counted. The client then sees a gap in ``seq`` and asks for a
  snapshot; a new snapshot clears the lane, since every queued step is older.

Both lanes together hold at most ``max_bytes`` of frames (frames are compact ASCII
JSON, so ``len`` is their size in bytes). A reply that does not fit first evicts
the queued steps (droppable); if it still does not fit, ``put_reply`` says so and
the connection must be closed: a client that lets that much pile up is not
reading. One frame bigger than the whole bound (a snapshot of a huge pool) is
still let in when nothing else is queued, so memory stays under
``max(max_bytes, one frame)``.

A snapshot supersedes an unsent older snapshot: the older one is dropped, so a
client that asks for a hundred snapshots without reading is owed one.

Writer: the Hub (deliveries) and the connection's writer task (``get``), both on
the loop thread, so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Outbox:
    def __init__(self, max_steps: int, max_bytes: int,
                 on_drop: Callable[[int], None] = lambda n: None) -> None:
        if max_steps < 1 or max_bytes < 1:
            raise ValueError("max_steps and max_bytes must be >= 1")
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self._replies: deque[tuple[str, bool]] = deque()  # (frame, is a snapshot)
        self._steps: deque[str] = deque()
        self._wake = asyncio.Event()
        self.num_bytes = 0  # queued in both lanes
        self.dropped_steps = 0
        self.on_drop = on_drop  # told how many steps each drop cost (the hub counts them in /metrics)
        self.superseded_snapshots = 0
        self.max_steps_seen = 0  # high-water marks (tests and /metrics)
        self.max_bytes_seen = 0
        self.closed = False

    def put_reply(self, frame: str, snapshot: bool = False) -> bool:
        """Queue a reply; False when it cannot fit in the byte bound (the client must go)."""
        if self.closed:
            return False
        if snapshot:
            self._drop_snapshots()
            self.clear_steps()  # all older than this snapshot
        if not self._fits(len(frame)):
            self._dropped(len(self._steps))
            self.clear_steps()
            if not self._fits(len(frame)):
                return False
        self._replies.append((frame, snapshot))
        self._grew(len(frame))
        return True

    def put_step(self, frame: str) -> bool:
        """Queue a step message; False (and counted) when the lane or the bound is full."""
        if self.closed:
            return False
        if len(self._steps) >= self.max_steps or not self._fits(len(frame)):
            self._dropped(1)
            return False
        self._steps.append(frame)
        self.max_steps_seen = max(self.max_steps_seen, len(self._steps))
        self._grew(len(frame))
        return True

    def clear_steps(self) -> None:
        """Drop queued steps: a snapshot or a new run that follows supersedes them."""
        self.num_bytes -= sum(len(f) for f in self._steps)
        self._steps.clear()

    def _drop_snapshots(self) -> None:
        if any(snap for _, snap in self._replies):
            kept = deque(r for r in self._replies if not r[1])
            self.superseded_snapshots += len(self._replies) - len(kept)
            self.num_bytes -= sum(len(f) for f, snap in self._replies if snap)
            self._replies = kept

    def _dropped(self, n: int) -> None:
        self.dropped_steps += n
        self.on_drop(n)

    def _fits(self, size: int) -> bool:
        return self.num_bytes + size <= self.max_bytes or not (self._replies or self._steps)

    def _grew(self, size: int) -> None:
        self.num_bytes += size
        self.max_bytes_seen = max(self.max_bytes_seen, self.num_bytes)
        self._wake.set()

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    @property
    def num_replies(self) -> int:
        return len(self._replies)

    @property
    def num_snapshots(self) -> int:
        return sum(1 for _, snap in self._replies if snap)

    async def get(self) -> str:
        """The next frame to send, replies first."""
        while not (self._replies or self._steps):
            self._wake.clear()
            await self._wake.wait()
        frame = self._replies.popleft()[0] if self._replies else self._steps.popleft()
        self.num_bytes -= len(frame)
        return frame

    def close(self) -> None:
        self.closed = True
        self._replies.clear()
        self._steps.clear()
        self.num_bytes = 0
        self._wake.set()

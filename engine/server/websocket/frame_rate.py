"""FrameRate: how fast one websocket connection may send, in frames and in bytes.

Every inbound frame costs the event-loop thread its parsing and answering, whatever it
says: a ping is answered there, a malformed frame is refused there, a 1 MB prompt is
decoded and measured there. Unbounded, one client sending as fast as its socket allows
(20,000 pings in a burst, say) holds the loop, and through the GIL the engine thread,
for hundreds of milliseconds at a time: every other client's steps stall (issue 17's
soak: 0.2-0.7 s engine gaps every 6 s, one per ping burst). So each connection gets
two token buckets, frames and bytes, and past either the hub stops reading that
connection for as long as the bucket needs to refill. Nothing is refused: the client's
frames wait in its own socket and the kernel pushes back on its sends (uvicorn reads a
connection only while its handler asks for the next frame), so a fast client is slowed
to the rate and a polite one never notices (the dashboard sends a few frames a second;
a script's submits are bounded by ``--max-in-flight`` anyway).

Writer: the hub, on the loop thread; one per connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


FRAMES_PER_S = 200.0
FRAME_BURST = 400
BYTES_PER_S = float(8 << 20)
BYTE_BURST = 4 << 20  # four frames of the default 1 MiB --max-frame-bytes


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A connection's sustained rates and bursts; a rate of 0 means no bound."""

    frames_per_s: float = FRAMES_PER_S
    frame_burst: int = FRAME_BURST
    bytes_per_s: float = BYTES_PER_S
    byte_burst: int = BYTE_BURST

    def __post_init__(self) -> None:
        for name in ("frames_per_s", "bytes_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{name} must be a number >= 0 (0: no bound), got {v!r}")
        for name in ("frame_burst", "byte_burst"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")


class _Bucket:
    """``rate`` tokens a second up to ``burst``; a take past empty is a debt, and its
    wait is the time the debt takes to refill. A rate of 0: no bound, no wait."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)

    def take(self, amount: float, dt: float) -> float:
        if not self.rate:
            return 0.0
        self.tokens = min(self.burst, self.tokens + dt * self.rate) - amount
        return max(0.0, -self.tokens / self.rate)


class FrameRate:
    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._frames = _Bucket(limit.frames_per_s, limit.frame_burst)
        self._bytes = _Bucket(limit.bytes_per_s, limit.byte_burst)
        self._t = clock()

    def charge(self, nbytes: int) -> float:
        """Take one frame of ``nbytes``; the seconds to stop reading before the next
        frame (0.0: read on): the longer of the two buckets' waits."""
        now = self._clock()
        dt, self._t = max(0.0, now - self._t), now
        return max(self._frames.take(1, dt), self._bytes.take(nbytes, dt))

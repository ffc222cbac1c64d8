"""RequestBook: the server's record of live requests (which sink submitted what).

The engine knows requests; the server must also know which sink each belongs to
(only the submitter gets its outputs and may abort it, a vanished submitter's
requests are aborted), enforce the per-sink in-flight limit and the server's
bound on ``n``, refuse a reused request id and keep the sampling params to
record when the request finishes.

Reused ids (a finished request's SQLite row would be replaced): an id is refused
while its request is live, always, and after it finished for as long as it is
one of the last ``remember`` ids admitted this run (65,536 by default: ~10 MB
at most, since ids are at most 128 characters). An older id may be used again;
the run's recorded row for it is then the newer request's. Ids the server names
itself (``c<sink>-<n>``) never repeat within a server's life.

Writer: the engine thread only (no locks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.sampling_params import SamplingParams
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error
from engine.server.worker.sink import Sink

MAX_N = 64  # samples per request: each is a sequence; 10^6 of them would sink the host
REMEMBER_IDS = 1 << 16  # finished ids refused for reuse, per run (the newest ones)


@dataclass(slots=True)
class Owned:
    sink: Sink
    params: dict[str, Any]  # SamplingParams.to_dict(), recorded with the request


class RequestBook:
    def __init__(self, max_in_flight_per_sink: int, max_n: int = MAX_N,
                 remember: int = REMEMBER_IDS) -> None:
        self.max_in_flight = max_in_flight_per_sink
        self.max_n = max_n
        self._owned: dict[str, Owned] = {}
        self._in_flight: dict[int, int] = {}  # sink id -> live requests (ids: no hashing of sinks)
        self.remember = remember
        self._used: dict[str, None] = {}  # the last ``remember`` ids admitted this run, oldest first
        self._next = 0

    def new_run(self) -> None:
        """A new run (restart): ids may be used again. Live requests must be gone."""
        assert not self._owned, "requests outlived their run"
        self._used.clear()

    def name(self, sink: Sink) -> str:
        """A fresh id for a request submitted without one."""
        self._next += 1
        return f"c{sink.id}-{self._next}"

    def refuse(self, sink: Sink, rid: str, params: SamplingParams) -> Error | None:
        """Why this sink may not submit ``rid`` now, or None."""
        if params.n > self.max_n:
            return Error(ErrorCode.BAD_PARAMS, f"n must be <= {self.max_n} on this server, got {params.n}",
                         rid, "submit")
        if self._in_flight.get(sink.id, 0) >= self.max_in_flight:
            return Error(ErrorCode.TOO_MANY_IN_FLIGHT, f"this connection already has {self.max_in_flight} "
                         f"requests in flight; wait for one to finish", rid, "submit")
        if rid in self._owned or rid in self._used:
            return Error(ErrorCode.DUPLICATE_REQUEST_ID, f"request id {rid!r} was already used in this run",
                         rid, "submit")
        return None

    def add(self, rid: str, sink: Sink, params: dict[str, Any]) -> None:
        self._used[rid] = None
        if len(self._used) > self.remember:  # forget the oldest (a live one stays refused: _owned)
            del self._used[next(iter(self._used))]
        self._owned[rid] = Owned(sink, params)
        self._in_flight[sink.id] = self._in_flight.get(sink.id, 0) + 1

    def get(self, rid: str) -> Owned | None:
        return self._owned.get(rid)

    def release(self, rid: str) -> None:
        owned = self._owned.pop(rid, None)
        if owned is not None:  # counted by add
            self._in_flight[owned.sink.id] -= 1
            if not self._in_flight[owned.sink.id]:
                del self._in_flight[owned.sink.id]

    def live(self, sink: Sink | None = None) -> list[str]:
        """Live request ids (of one sink, or all)."""
        return [r for r, o in self._owned.items() if sink is None or o.sink is sink]

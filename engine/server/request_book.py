"""RequestBook: the server's record of live requests (who submitted what).

The engine knows requests; the server must also know which connection each
belongs to (only the submitter gets its outputs, a vanished submitter's
requests are aborted), enforce the per-connection in-flight limit, refuse a
request id reused within a run (its SQLite row would be overwritten) and keep
the sampling params to record when the request finishes.

Writer: the engine thread only (no locks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.outputs import RequestOutput
from engine.server.protocol import Error, ErrorCode as E


@dataclass(slots=True)
class Owned:
    conn_id: int
    params: dict[str, Any]  # SamplingParams.to_dict(), recorded with the request
    source: str = "websocket"  # engine_commands.Source value: how outputs are delivered, recorded


class RequestBook:
    def __init__(self, max_in_flight_per_conn: int) -> None:
        self.max_in_flight = max_in_flight_per_conn
        self._owned: dict[str, Owned] = {}
        self._in_flight: dict[int, int] = {}  # conn_id -> live requests
        self._used: set[str] = set()  # ids used this run
        self._next = 0

    def new_run(self) -> None:
        """A new run (restart): ids may be used again. Live requests must be gone."""
        assert not self._owned, "requests outlived their run"
        self._used.clear()

    def name(self, conn_id: int) -> str:
        """A fresh id for a request submitted without one."""
        self._next += 1
        return f"c{conn_id}-{self._next}"

    def refuse(self, conn_id: int, rid: str) -> Error | None:
        """Why this connection may not submit ``rid`` now, or None."""
        if self._in_flight.get(conn_id, 0) >= self.max_in_flight:
            return Error(E.TOO_MANY_IN_FLIGHT, f"this connection already has {self.max_in_flight} "
                         f"requests in flight; wait for one to finish", rid, "submit")
        if rid in self._used:
            return Error(E.DUPLICATE_REQUEST_ID, f"request id {rid!r} was already used in this run",
                         rid, "submit")
        return None

    def add(self, rid: str, conn_id: int, params: dict[str, Any], source: str = "websocket") -> None:
        self._used.add(rid)
        self._owned[rid] = Owned(conn_id, params, source)
        self._in_flight[conn_id] = self._in_flight.get(conn_id, 0) + 1

    def get(self, rid: str) -> Owned | None:
        return self._owned.get(rid)

    def release(self, rid: str) -> None:
        owned = self._owned.pop(rid, None)
        if owned is not None and owned.conn_id in self._in_flight:
            self._in_flight[owned.conn_id] -= 1
            if not self._in_flight[owned.conn_id]:
                del self._in_flight[owned.conn_id]

    def live(self, conn_id: int | None = None) -> list[str]:
        """Live request ids (of one connection, or all)."""
        return [r for r, o in self._owned.items() if conn_id is None or o.conn_id == conn_id]


def finished_fields(out: RequestOutput) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``outputs`` and ``metrics`` of a ``finished`` message (also what is recorded)."""
    outputs = [{"index": c.index, "text": c.text, "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
               for c in out.outputs]
    m = out.metrics
    metrics: dict[str, Any] = {
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        "num_output_tokens": sum(len(c.token_ids) for c in out.outputs),
    }
    if m is not None:
        metrics.update(arrival_time=m.arrival_time, first_scheduled_time=m.first_scheduled_time,
                       first_token_time=m.first_token_time, last_token_time=m.last_token_time,
                       finished_time=m.finished_time, ttft=m.ttft, e2e=m.e2e)
    return outputs, metrics

"""Inbound: one websocket connection's ops on their way to the engine thread.

Submits are prepared first (checked and tokenized by ``Hub.prepare`` in the hub's
worker pool, so no prompt costs the event loop or the engine thread its tokenizing
time); every other engine op goes straight to the mailbox, unless it would overtake a
submit still being prepared: a connection's ops reach the engine thread in the order
it sent them (an ``abort`` never passes its own ``submit``).

A submit is in flight (``ClientConn.in_flight``) from the moment it is taken here,
before it is tokenized or checked, until its verdict is a refusal or, once accepted,
its request finished. Counting the ones not yet answered matters: a client sending big
prompts that will all be refused would otherwise keep any number of them being
tokenized at once. Past ``HubLimits.max_in_flight`` a submit is refused here, before any work,
with ``too_many_in_flight``; the engine thread's RequestBook keeps its own count of
accepted requests for every front door. Every submit gets exactly one verdict, in the
order it was sent: ``accepted``, or an ``error`` whose ``op`` is ``submit``. An error
about a request already accepted (its step failed) carries no op and is not a verdict;
its ``finished`` follows.

Ops waiting behind a submit in preparation are bounded (``max_queued``); past that the
op is refused with ``busy``.

Writer: the Hub, on the event-loop thread (the pump task runs there too).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import Error
from engine.protocol.ops import Op, Submit
from engine.server.worker.mailbox import Prepared

if TYPE_CHECKING:
    from engine.server.websocket.hub import Hub
    from engine.server.websocket.ws_connection import ClientConn

log = logging.getLogger("kvscope.server")

MAX_QUEUED = 1024  # ops of one connection waiting behind a submit in preparation


class Inbound:
    def __init__(self, conn: ClientConn, hub: Hub, max_queued: int = MAX_QUEUED) -> None:
        self.conn = conn
        self.hub = hub
        self.max_queued = max_queued
        self._queue: deque[Op] = deque()
        self._pump: asyncio.Task | None = None

    def take(self, op: Op) -> None:
        """An engine op of this connection, parsed and valid."""
        if isinstance(op, Submit):
            self.conn.in_flight += 1  # from here on it is owed exactly one verdict
            limit = self.hub.limits.max_in_flight
            if self.conn.in_flight > limit:
                self._refuse(refused(ErrorCode.TOO_MANY_IN_FLIGHT, f"this connection already has "
                             f"{limit} requests in flight (being checked or running); "
                             f"wait for one to finish", op))
                return
        if self._pump is None and (not isinstance(op, Submit) or self.hub.prep is None):
            self._post(op)  # nothing of it ahead, nothing to prepare (no run yet: the engine does)
            return
        if len(self._queue) >= self.max_queued:
            self._refuse(refused(ErrorCode.BUSY, f"{self.max_queued} ops of this connection are "
                                 f"waiting for a submit to be prepared; retry shortly", op))
            return
        self._queue.append(op)
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run())

    def close(self) -> None:
        """The connection is gone: nothing more of it may reach the engine thread (its
        Detach is next), so a submit still being prepared is dropped."""
        self._queue.clear()
        if self._pump is not None:
            self._pump.cancel()

    async def _run(self) -> None:
        try:
            while self._queue:
                op = self._queue.popleft()
                if isinstance(op, Submit):
                    try:
                        op = await self.hub.prepare(op)
                    except ProtocolError as exc:
                        self._refuse(exc)
                        continue
                    except Exception as exc:  # a bug in preparing must cost only this submit
                        log.exception("kvscope: preparing a submit failed")
                        self._refuse(refused(ErrorCode.INTERNAL, f"preparing the prompt failed: "
                                             f"{exc}", op))
                        continue
                self._post(op)
        finally:
            self._pump = None

    def _post(self, cmd: Op | Prepared) -> None:
        try:
            self.hub.post(self.conn, cmd)
        except ProtocolError as exc:
            self._refuse(exc)

    def _refuse(self, exc: ProtocolError) -> None:
        """Answer an op here; a refused submit got its verdict (``ClientConn.deliver``)."""
        self.conn.deliver(Error.from_exc(exc))


def refused(code: str, message: str, op: Op) -> ProtocolError:
    """The refusal of ``op`` (with its request id, if it names one)."""
    return ProtocolError(code, message, getattr(op, "request_id", None), op.type)

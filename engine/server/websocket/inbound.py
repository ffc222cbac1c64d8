"""Inbound: one websocket connection's ops on their way to the engine thread.

Submits are prepared first (checked and tokenized by ``PromptPrep`` in the hub's
worker thread, so no prompt costs the event loop or the engine thread its
tokenizing time); every other engine op goes straight to the mailbox, unless it
would overtake a submit still being prepared: a connection's ops reach the engine
thread in the order it sent them (an ``abort`` never passes its own ``submit``).

A submit is refused here, before any work, when the connection already has
``max_in_flight`` submits in flight, those still being prepared or checked
included (``InFlight``). Ops waiting behind a submit in preparation are bounded
(``max_queued``); past that the op is refused with ``busy``.

Writer: the Hub, on the event-loop thread (the pump task runs there too).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.messages import Error
from engine.protocol.ops import Op, Submit
from engine.server.worker.mailbox import Mailbox, Prepared
from engine.server.worker.prompt_prep import PromptPrep

if TYPE_CHECKING:
    from engine.server.websocket.ws_connection import ClientConn

log = logging.getLogger("kvscope.server")

MAX_QUEUED = 1024  # ops of one connection waiting behind a submit in preparation


class Inbound:
    def __init__(self, conn: ClientConn, mailbox: Mailbox, workers: Executor,
                 prep: Callable[[], PromptPrep | None], stopping: Callable[[], bool],
                 max_in_flight: int, max_queued: int = MAX_QUEUED) -> None:
        self.conn = conn
        self.mailbox = mailbox
        self.workers = workers
        self.prep = prep  # the current engine's (None until the first run is delivered)
        self.stopping = stopping
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._queue: deque[Op] = deque()
        self._pump: asyncio.Task | None = None

    def take(self, op: Op) -> None:
        """An engine op of this connection, parsed and valid."""
        if isinstance(op, Submit):
            self.conn.in_flight.taken()  # from here on it is owed exactly one verdict
            if len(self.conn.in_flight) > self.max_in_flight:
                self._refuse(ErrorCode.TOO_MANY_IN_FLIGHT, f"this connection already has "
                             f"{self.max_in_flight} requests in flight (being checked or running); "
                             f"wait for one to finish", op)
                return
        if self.stopping():
            self._refuse(ErrorCode.SHUTTING_DOWN, "the server is shutting down", op)
            return
        if self._pump is None and (not isinstance(op, Submit) or self.prep() is None):
            self._post(op)  # nothing of it ahead, nothing to prepare (no run yet: the engine does)
            return
        if len(self._queue) >= self.max_queued:
            self._refuse(ErrorCode.BUSY, f"{self.max_queued} ops of this connection are waiting "
                         f"for a submit to be prepared; retry shortly", op)
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
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                op = self._queue.popleft()
                prep = self.prep()
                if isinstance(op, Submit) and prep is not None:
                    try:
                        op = await loop.run_in_executor(self.workers, prep.prepare, op)
                    except ProtocolError as exc:
                        self._refuse(exc.code, exc.message, exc)
                        continue
                    except Exception as exc:  # a bug in preparing must cost only this submit
                        log.exception("kvscope: preparing a submit failed")
                        self._refuse(ErrorCode.INTERNAL, f"preparing the prompt failed: {exc}", op)
                        continue
                    if self.stopping():
                        self._refuse(ErrorCode.SHUTTING_DOWN, "the server is shutting down", op.submit)
                        continue
                self._post(op)
        finally:
            self._pump = None

    def _post(self, cmd: Op | Prepared) -> None:
        if not self.mailbox.send(self.conn, cmd):
            op = cmd.submit if isinstance(cmd, Prepared) else cmd
            self._refuse(ErrorCode.BUSY, "the engine's command queue is full; retry shortly", op)

    def _refuse(self, code: str, message: str, about: Op | ProtocolError) -> None:
        """Answer an op here; a refused submit got its verdict (InFlight stops counting it)."""
        if isinstance(about, ProtocolError):
            error = Error(code, message, about.request_id, about.op)
        else:
            error = refusal(code, message, about)
        if error.op == Submit.type:
            self.conn.in_flight.refused()
        self.conn.reply(error)


def refusal(code: str, message: str, op: Op) -> Error:
    """The error answering ``op`` (with its request id, if it names one)."""
    return Error(code, message, getattr(op, "request_id", None), op.type)

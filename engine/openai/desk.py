"""ApiDesk and Exchange: HTTP API calls on the engine thread's mailbox (loop thread).

An API call is an ``Exchange``: it gets its own connection id, submits its engine
requests as ``Submit`` commands (source ``openai``) through the same bounded
CommandQueue as websocket ops, and receives the engine thread's ``accepted`` /
``error`` / ``ok`` replies and ``RequestOut`` deliveries addressed to that id. When
the call ends for any reason (answered, client gone, error) the desk sends
``Detach``, which aborts whatever of it is still live: blocks freed, ``abort`` in the
events. Detach queues behind the exchange's own Submits (FIFO), so even a request
still in the queue cannot outlive its caller.

Connection ids of exchanges are negative and the Hub's websockets positive, so the
engine thread's RequestBook keeps them apart without knowing about HTTP, and the
server hands a delivery to the desk when its id is negative.

Outputs are coalesced per request while the handler is busy (a slow reader gets
bigger deltas, not a growing queue): memory per exchange stays bounded by its
requests' own outputs.

Writer: the loop thread only (deliveries from ``KVScopeServer``; handlers of the routes).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from engine.openai.choices import Update
from engine.openai.errors import ApiError, from_engine
from engine.outputs import RequestOutput
from engine.server import engine_commands as C
from engine.server.protocol import Accepted, Error, Message

LIVENESS_POLL_S = 1.0  # how often a waiting handler checks that the engine thread still runs


class Exchange:
    """One API call's mailbox (see module docstring)."""

    def __init__(self, desk: ApiDesk, conn_id: int) -> None:
        self.desk = desk
        self.conn_id = conn_id
        self.rids: list[str] = []
        self.accepted: set[str] = set()
        self.refusal: Error | None = None  # the first error before every request was accepted
        self.late_errors: list[Error] = []  # errors after acceptance (an engine fault)
        self.replies: list[Message] = []  # ok / error for control commands
        # request id -> (latest output, per sample: delta texts and token ids since last look)
        self._pending: dict[str, tuple[RequestOutput, dict[int, tuple[list[str], list[int]]]]] = {}
        self._wake = asyncio.Event()

    # ---- into the engine --------------------------------------------------------------

    def submit(self, cmd: C.Submit) -> None:
        """Queue one engine request; 429 when the engine's command queue is full."""
        if not self.desk.commands.try_put(cmd):
            raise ApiError(429, "the engine's command queue is full; retry shortly",
                           "rate_limit_error", None, "busy")
        self.rids.append(cmd.request_id)

    def command(self, cmd: C.Command) -> None:
        if not self.desk.commands.try_put(cmd):
            raise ApiError(429, "the engine's command queue is full; retry shortly",
                           "rate_limit_error", None, "busy")

    # ---- from the engine (loop thread, via the desk) ---------------------------------

    def receive(self, d: C.Delivery) -> None:
        if isinstance(d, C.RequestOut):
            out = d.output
            merged = self._pending[out.request_id][1] if out.request_id in self._pending else {}
            for k, (text, ids) in out.deltas.items():
                texts, tokens = merged.setdefault(k, ([], []))
                texts.append(text)
                tokens.extend(ids)
            self._pending[out.request_id] = (out, merged)
        elif isinstance(d, C.ToClient):
            msg = d.message
            if isinstance(msg, Accepted):
                self.accepted.add(msg.request_id)
            elif isinstance(msg, Error) and msg.request_id in self.rids:
                if msg.request_id in self.accepted:
                    self.late_errors.append(msg)
                elif self.refusal is None:
                    self.refusal = msg
            else:
                self.replies.append(msg)
        self._wake.set()

    # ---- waiting (the route handler) ------------------------------------------------

    async def _wait(self, ready: Callable[[], bool]) -> None:
        while not ready():
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), LIVENESS_POLL_S)
            except asyncio.TimeoutError:
                if not self.desk.alive():
                    raise ApiError(500, "the engine thread has stopped; see the server log",
                                   "server_error", None, "internal") from None

    async def accept_all(self) -> None:
        """Wait until the engine accepted every request of this call; raises the first
        refusal (the others are aborted when the exchange closes)."""
        await self._wait(lambda: self.refusal is not None or len(self.accepted) == len(self.rids))
        if self.refusal is not None:
            raise_refusal(self.refusal)

    async def updates(self) -> list[Update]:
        """Everything that arrived since the last call (waits for something)."""
        await self._wait(lambda: bool(self._pending or self.late_errors))
        ups = [Update(out, {k: ("".join(t), ids) for k, (t, ids) in merged.items()})
               for out, merged in self._pending.values()]
        self._pending.clear()
        return ups

    def take_errors(self) -> list[Error]:
        errs, self.late_errors = self.late_errors, []
        return errs

    async def reply(self) -> Message:
        """The engine's answer to a control command."""
        await self._wait(lambda: bool(self.replies))
        return self.replies.pop(0)


def raise_refusal(err: Error) -> None:
    param = "prompt" if err.code == "prompt_too_long" else None
    raise from_engine(err, param)


class ApiDesk:
    """Routes deliveries to exchanges; opens and closes them."""

    def __init__(self, commands: C.CommandQueue, alive: Callable[[], bool] = lambda: True) -> None:
        self.commands = commands
        self.alive = alive  # False once the engine thread is gone
        self.exchanges: dict[int, Exchange] = {}
        self.stopping = False
        self._ids = itertools.count(-1, -1)

    @staticmethod
    def takes(d: C.Delivery) -> bool:
        """Whether a delivery is addressed to an exchange (a negative connection id)."""
        return isinstance(d, (C.ToClient, C.RequestOut)) and d.conn_id < 0

    def deliver(self, d: C.Delivery) -> None:
        ex = self.exchanges.get(d.conn_id)
        if ex is not None:
            ex.receive(d)

    def open(self) -> Exchange:
        ex = Exchange(self, next(self._ids))
        self.exchanges[ex.conn_id] = ex
        return ex

    def close(self, ex: Exchange) -> None:
        """End an exchange; whatever of it is still live in the engine is aborted."""
        if self.exchanges.pop(ex.conn_id, None) is not None and ex.rids:
            self.commands.put(C.Detach(ex.conn_id))

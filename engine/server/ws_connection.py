"""ClientConn: one websocket client, as the Sink its answers go to (loop thread).

It turns the engine thread's answers into frames in its Outbox (a RequestOutput
becomes ``output`` deltas and ``finished``), and one writer task drains the
outbox into the socket, so a stalled socket blocks only its own writer. It is
subscribed to steps from its first snapshot on (the answer to ``Attach``); a
snapshot drops the queued steps, which are all older than it.

Writer of its outbox and flags: the hub and this connection's writer task, both
on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import ClassVar

from websockets.exceptions import ConnectionClosed

from engine.outputs import RequestOutput
from engine.protocol.codec import encode
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error, Hello, Message, Snapshot
from engine.server.outbox import Outbox
from engine.server.output_messages import output_messages
from engine.server.prom import ServerMetrics
from engine.server.sink import Sink, SinkItem, Source
from engine.server.ws_adapter import AsgiWebSocket

log = logging.getLogger("kvscope.server")

SLOW_CLIENT_CLOSE = 1008  # policy violation: it let replies pile up past the bound


@dataclass(eq=False)
class ClientConn(Sink):
    source: ClassVar[Source] = Source.WEBSOCKET
    id: int
    ws: AsgiWebSocket
    outbox: Outbox
    metrics: ServerMetrics
    attached: bool = False  # got hello + snapshot; receives steps from now on
    closing: bool = False
    steps_pending: bool = False  # a steps_since is being answered (one at a time)
    writer: asyncio.Task | None = field(default=None, repr=False)

    def deliver(self, item: SinkItem) -> None:
        if self.outbox.closed:
            return  # gone: its Detach is on its way to the engine thread
        if isinstance(item, RequestOutput):
            for msg in output_messages(item):
                self.reply(msg)
            return
        if isinstance(item, Snapshot):
            self.outbox.clear_steps()  # all older than this snapshot
            self.attached = True
        self.reply(item)

    def rebase(self, hello: Hello, snapshot: Snapshot) -> None:
        """A new run: drop steps of the old one, then its hello and first snapshot."""
        self.outbox.clear_steps()
        self.reply(hello)
        self.reply(snapshot)

    def put_step(self, frame: str) -> bool:
        """Queue an encoded step; False (and counted) when this client is too slow."""
        if self.outbox.put_step(frame):
            return True
        self.metrics.dropped_steps.inc()
        return False

    def reply(self, msg: Message) -> None:
        if isinstance(msg, Error):
            self.metrics.errors.labels(msg.code).inc()
        if self.outbox.put_reply(encode(msg)) or self.closing or self.outbox.closed:
            return
        self.closing = True
        log.warning("kvscope: closing connection %d: %d replies unread", self.id, self.outbox.num_replies)
        asyncio.ensure_future(self.ws.close(SLOW_CLIENT_CLOSE, ErrorCode.SLOW_CLIENT))

    async def write(self) -> None:
        """The writer task: send queued frames until the connection closes."""
        try:
            while True:
                await self.ws.send(await self.outbox.get())
        except ConnectionClosed:
            pass

"""ClientConn: one websocket client, as the Sink its answers go to (loop thread).

It turns the engine thread's answers into frames in its Outbox (a RequestOutput
becomes ``output`` deltas and ``finished``), and one writer task drains the
outbox into the socket, so a stalled socket blocks only its own writer. It is
subscribed to steps from its first snapshot on (the answer to ``Attach``); a
snapshot drops the queued steps, which are all older than it, and any unsent
older snapshot. A client whose unsent frames would pass the outbox's byte bound
is closed (1008, reason ``slow_client``) and counted in /metrics.

Hello and snapshot messages go to many connections at once (every subscriber
after a restart, every asker in one snapshot round): each is encoded once per
delivery batch (``BatchMemo``), so N connections queue one string, not N copies.

Writer of its outbox and flags: the hub and this connection's writer task, both
on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, ClassVar

from websockets.exceptions import ConnectionClosed

from engine.outputs import RequestOutput
from engine.protocol.codec import encode
from engine.protocol.errors import ErrorCode
from engine.protocol.messages import Error, Hello, Message, Snapshot
from engine.protocol.ops import Submit
from engine.server.websocket.inbound import Inbound
from engine.server.websocket.outbox import Outbox
from engine.server.worker.output_messages import output_messages
from engine.server.metrics.prom import ServerMetrics
from engine.server.worker.sink import Sink, SinkItem, Source
from engine.server.port.ws_adapter import AsgiWebSocket

log = logging.getLogger("kvscope.server")

SLOW_CLIENT_CLOSE = 1008  # policy violation: it let replies pile up past the bound


class BatchMemo:
    """What was made of the messages of one delivery batch (their frames, their redacted
    copies), by object identity; the object is kept with it, so a reused id never hits.

    Writer: the Hub, which clears it after each batch (the messages live as long as it)."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[Any, Any]] = {}

    def get(self, obj: Any, make: Callable[[Any], Any]) -> Any:
        hit = self._made.get(id(obj))
        if hit is None or hit[0] is not obj:
            hit = self._made[id(obj)] = (obj, make(obj))
        return hit[1]

    def clear(self) -> None:
        self._made.clear()


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
    frames: BatchMemo = field(default_factory=BatchMemo, repr=False)  # the hub's
    in_flight: int = 0  # submits taken and not yet refused or finished (``inbound``)
    inbound: Inbound | None = field(default=None, repr=False)  # set by the hub

    def deliver(self, item: SinkItem) -> None:
        if (isinstance(item, Error) and item.op == Submit.type
                or isinstance(item, RequestOutput) and item.finished):
            self.in_flight -= 1  # a submit's verdict was a refusal, or its request ended
        if self.outbox.closed:
            return  # gone: its Detach is on its way to the engine thread
        if isinstance(item, RequestOutput):
            for msg in output_messages(item):
                self.reply(msg)
            return
        if isinstance(item, Snapshot):
            self.attached = True
        self.reply(item)

    def rebase(self, hello: Hello, snapshot: Snapshot) -> None:
        """A new run: drop steps of the old one, then its hello and first snapshot."""
        self.outbox.clear_steps()
        self.reply(hello)
        self.reply(snapshot)

    def reply(self, msg: Message) -> None:
        if isinstance(msg, Error):
            self.metrics.errors.labels(msg.code).inc()
        box = self.outbox
        shared = isinstance(msg, (Hello, Snapshot))  # the ones sent to many connections
        ok = box.put_reply(self.frames.get(msg, encode) if shared else encode(msg),
                           snapshot=isinstance(msg, Snapshot))
        if ok or self.closing or box.closed:
            return
        self.closing = True
        reason = f"{ErrorCode.SLOW_CLIENT}: over {box.max_bytes} bytes unread"
        log.warning("kvscope: closing connection %d: %s (%d replies, %d steps queued)", self.id,
                    reason, box.num_replies, box.num_steps)
        self.metrics.slow_client_closes.inc()
        box.close()  # free what it will never read now, not when the close handshake ends
        asyncio.ensure_future(self.ws.close(SLOW_CLIENT_CLOSE, reason))

    async def write(self) -> None:
        """The writer task: send queued frames until the connection closes."""
        try:
            while True:
                await self.ws.send(await self.outbox.get())
        except ConnectionClosed:
            pass

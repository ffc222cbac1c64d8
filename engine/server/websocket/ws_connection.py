"""ClientConn: one websocket client, as the Sink its answers go to (loop thread).

It turns the engine thread's answers into frames in its Outbox (a RequestOutput
becomes ``output`` deltas and ``finished``), and one writer task drains the
outbox into the socket, so a stalled socket blocks only its own writer. It is
subscribed to steps from its first snapshot on (the answer to ``Attach``); a
snapshot drops the queued steps, which are all older than it, and any unsent
older snapshot. A client whose unsent frames would pass the outbox's byte bound
is closed (1008, reason ``slow_client``) and counted in /metrics.

Hello and snapshot messages go to many connections at once (every subscriber
after a restart, every asker in one snapshot round): ``SharedFrames`` encodes
each once per delivery batch, so N connections queue one string, not N copies.

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
from engine.server.websocket.in_flight import InFlight
from engine.server.websocket.inbound import Inbound
from engine.server.websocket.outbox import Outbox
from engine.server.worker.output_messages import output_messages
from engine.server.metrics.prom import ServerMetrics
from engine.server.worker.sink import Sink, SinkItem, Source
from engine.server.port.ws_adapter import AsgiWebSocket

log = logging.getLogger("kvscope.server")

SLOW_CLIENT_CLOSE = 1008  # policy violation: it let replies pile up past the bound


class SharedFrames:
    """Encoded frames of the messages of one delivery batch, by object identity.

    Writer: the Hub, which clears it after each batch (the messages, and so their ids,
    live as long as the batch)."""

    def __init__(self) -> None:
        self._frames: dict[int, tuple[Message, str]] = {}

    def encode(self, msg: Message) -> str:
        hit = self._frames.get(id(msg))
        if hit is not None and hit[0] is msg:
            return hit[1]
        frame = encode(msg)
        if isinstance(msg, (Hello, Snapshot)):  # the ones sent to many connections
            self._frames[id(msg)] = (msg, frame)
        return frame

    def clear(self) -> None:
        self._frames.clear()


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
    frames: SharedFrames = field(default_factory=SharedFrames, repr=False)  # the hub's
    in_flight: InFlight = field(default_factory=InFlight, repr=False)
    inbound: Inbound | None = field(default=None, repr=False)  # set by the hub

    def deliver(self, item: SinkItem) -> None:
        self.in_flight.observe(item)
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

    def put_step(self, frame: str) -> bool:
        """Queue an encoded step; False (and counted) when this client is too slow."""
        if self.outbox.put_step(frame):
            return True
        self.metrics.dropped_steps.inc()
        return False

    def reply(self, msg: Message) -> None:
        if isinstance(msg, Error):
            self.metrics.errors.labels(msg.code).inc()
        box = self.outbox
        dropped = box.dropped_steps
        ok = box.put_reply(self.frames.encode(msg), snapshot=isinstance(msg, Snapshot))
        if box.dropped_steps > dropped:  # steps evicted to make room for the reply
            self.metrics.dropped_steps.inc(box.dropped_steps - dropped)
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

"""Hub: the websocket connections, on the event-loop thread.

Inbound, it parses each frame into an op and sends the engine thread a typed
command (or answers at once: ``ping``, and every malformed frame). Outbound, it
takes the engine thread's delivery batches and fills each connection's Outbox;
one writer task per connection drains it, so a stalled socket blocks only its
own writer. Steps are encoded once per step for all connections.

Writer of: the connection table and the outboxes (loop thread only).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from dataclasses import dataclass, field

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from engine.core import SamplingParamsError
from engine.core.sampling_params import SamplingParams
from engine.server import engine_commands as C
from engine.server import protocol as P
from engine.server.outbox import Outbox
from engine.server.prom import ServerMetrics

log = logging.getLogger("kvscope.server")
E = P.ErrorCode

SLOW_CLIENT_CLOSE = 1008  # policy violation: it let replies pile up past the bound


@dataclass(eq=False, slots=True)
class ClientConn:
    id: int
    ws: ServerConnection
    outbox: Outbox
    attached: bool = False  # got hello + snapshot; receives steps from now on
    closing: bool = False
    writer: asyncio.Task | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class HubLimits:
    max_frame_bytes: int = 1 << 20  # a prompt of ~250k tokens of text fits; a bigger frame is a bug
    step_buffer: int = 256  # unsent step messages per client before dropping (≈ seconds of steps)
    max_n: int = 64  # samples per request: each is a sequence; 10^6 of them would sink the host
    max_replies: int = 100_000  # unsent replies before a client is deemed dead (last resort)
    # Kernel send buffer per connection. Linux autotunes it up to 4 MiB on loopback,
    # which would let a stalled client lag by thousands of steps inside the kernel
    # before the outbox bound (the part we control and count) kicks in.
    socket_send_buffer: int = 256 << 10


class Hub:
    def __init__(self, commands: C.CommandQueue, metrics: ServerMetrics, limits: HubLimits) -> None:
        self.commands = commands
        self.metrics = metrics
        self.limits = limits
        self.conns: dict[int, ClientConn] = {}
        self.stopping = False
        self._ids = itertools.count(1)
        metrics.watch_hub(lambda: len(self.conns), self.max_outbox_steps)

    def max_outbox_steps(self) -> int:
        return max((c.outbox.num_steps for c in self.conns.values()), default=0)

    # ---- connections ---------------------------------------------------------------

    async def handle(self, ws: ServerConnection) -> None:
        """websockets' connection handler: runs for the life of one connection."""
        conn = ClientConn(next(self._ids), ws, Outbox(self.limits.step_buffer, self.limits.max_replies))
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.socket_send_buffer)
        self.conns[conn.id] = conn
        conn.writer = asyncio.create_task(self._write(conn), name=f"kvscope-writer-{conn.id}")
        self.commands.put(C.Attach(conn.id))
        try:
            async for frame in ws:
                self._on_frame(conn, frame)
        except ConnectionClosed:
            pass  # includes 1009 for frames past the hard size limit
        finally:
            self.conns.pop(conn.id, None)
            conn.outbox.close()
            # Its requests are aborted: nobody is left to read their outputs.
            self.commands.put(C.Detach(conn.id))
            conn.writer.cancel()
            await asyncio.gather(conn.writer, return_exceptions=True)

    async def _write(self, conn: ClientConn) -> None:
        try:
            while True:
                frame = await conn.outbox.get()
                await conn.ws.send(frame)
        except ConnectionClosed:
            pass

    def pending_replies(self) -> int:
        return sum(c.outbox.num_replies for c in self.conns.values())

    # ---- inbound ------------------------------------------------------------------------

    def _on_frame(self, conn: ClientConn, frame: str | bytes) -> None:
        if isinstance(frame, bytes):
            self._error(conn, P.Error(E.BINARY_FRAME, "binary frames are not part of the protocol; "
                                                      "send JSON text frames"))
            return
        size = len(frame.encode("utf-8"))
        if size > self.limits.max_frame_bytes:
            self._error(conn, P.Error(E.TOO_LARGE, f"frame of {size} bytes is over the limit of "
                                                   f"{self.limits.max_frame_bytes}"))
            return
        try:
            op = P.parse_op(frame)
            cmd = self._command(conn, op)
        except P.ProtocolError as exc:
            self._error(conn, P.Error.from_exc(exc))
            return
        if cmd is None:
            return
        if self.stopping:
            self._error(conn, P.Error(E.SHUTTING_DOWN, "the server is shutting down",
                                      getattr(cmd, "request_id", None), op.type))
        elif not self.commands.try_put(cmd):
            self._error(conn, P.Error(E.BUSY, "the engine's command queue is full; retry shortly",
                                      getattr(cmd, "request_id", None), op.type))

    def _command(self, conn: ClientConn, op: P.Op) -> C.Command | None:
        if isinstance(op, P.PingOp):
            self._reply(conn, P.Pong(time.time()))
            return None
        if isinstance(op, P.SubmitOp):
            try:  # validated here (pure Python) so bad params never reach the engine thread
                params = SamplingParams.from_dict(op.params)
            except SamplingParamsError as exc:
                raise P.ProtocolError(E.BAD_PARAMS, str(exc), op.request_id, "submit") from None
            if params.n > self.limits.max_n:
                raise P.ProtocolError(E.BAD_PARAMS, f"n must be <= {self.limits.max_n} on this server, "
                                      f"got {params.n}", op.request_id, "submit")
            return C.Submit(conn.id, op.request_id, op.prompt, op.messages, params)
        if isinstance(op, P.AbortOp):
            return C.Abort(conn.id, op.request_id)
        if isinstance(op, P.SnapshotOp):
            return C.TakeSnapshot(conn.id)
        if isinstance(op, P.ResetPrefixCacheOp):
            return C.ResetPrefixCache(conn.id)
        if isinstance(op, P.RestartOp):
            return C.Restart(conn.id, op.engine)
        raise AssertionError(f"op without a command: {op!r}")

    # ---- outbound -------------------------------------------------------------------------

    def deliver(self, batch: list[C.Delivery]) -> None:
        """Apply one batch from the engine thread (called on the loop, in order)."""
        for d in batch:
            if isinstance(d, C.StepOut):
                self._broadcast_step(d)
            elif isinstance(d, C.ToClient):
                conn = self.conns.get(d.conn_id)
                if conn is not None:
                    self._reply(conn, d.message)
            elif isinstance(d, C.Attached):
                conn = self.conns.get(d.conn_id)
                if conn is not None:
                    self._rebase(conn, d.hello, d.snapshot)
                    conn.attached = True
            elif isinstance(d, C.SnapshotTo):
                conn = self.conns.get(d.conn_id)
                if conn is not None:
                    conn.outbox.clear_steps()  # all older than this snapshot
                    self._reply(conn, d.snapshot)
            elif isinstance(d, C.NewRun):
                self.metrics.start_run(d.hello.config)
                for conn in list(self.conns.values()):
                    if conn.attached:
                        self._rebase(conn, d.hello, d.snapshot)
            else:
                raise TypeError(f"unknown delivery {d!r}")

    def _broadcast_step(self, d: C.StepOut) -> None:
        self.metrics.observe_step(d.record)
        if not self.conns:
            return
        frame = P.step_frame(d.record.to_dict())
        for conn in self.conns.values():
            if conn.attached and not conn.outbox.put_step(frame):
                self.metrics.dropped_steps.inc()

    def _rebase(self, conn: ClientConn, hello: P.Hello, snapshot: P.Snapshot) -> None:
        conn.outbox.clear_steps()  # steps of an older state or an older run
        self._reply(conn, hello)
        self._reply(conn, snapshot)

    def _error(self, conn: ClientConn, err: P.Error) -> None:
        self._reply(conn, err)

    def _reply(self, conn: ClientConn, msg: P.Message) -> None:
        if isinstance(msg, P.Error):
            self.metrics.errors.labels(msg.code).inc()
        if conn.outbox.put_reply(P.encode(msg)) or conn.closing:
            return
        conn.closing = True
        log.warning("kvscope: closing connection %d: %d replies unread", conn.id, conn.outbox.num_replies)
        asyncio.ensure_future(conn.ws.close(SLOW_CLIENT_CLOSE, E.SLOW_CLIENT))

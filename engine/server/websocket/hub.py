"""Hub: the websocket front door, on the event-loop thread.

Inbound, it parses each frame into a protocol op and hands that op to the
connection's ``Inbound``, which posts it, as is, to the engine thread's mailbox
with the connection as its sink; a submit is first prepared (checked and
tokenized) in the hub's worker thread, from the PromptPrep of the current run,
and posts as ``Prepared``. It answers two ops itself: ``ping``, and
``steps_since`` (from the step history, so the engine thread never reads
SQLite), and every malformed frame. Outbound, ``deliver``
applies the engine thread's delivery batches: replies go to their sink (a
connection here, or another front door's), steps to every subscribed
connection, encoded once per step.

Writer of: the connection table and the step history (loop thread only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from websockets.exceptions import ConnectionClosed

from engine.protocol.codec import encode, parse_op
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.events.redact import redact_snapshot, redact_step
from engine.protocol.messages import Error, Pong, Snapshot, Step, Steps
from engine.protocol.ops import Ping, StepsSince
from engine.server.websocket.frame_rate import FrameRate, RateLimit
from engine.server.websocket.inbound import Inbound, refusal
from engine.server.worker.mailbox import Attach, Delivery, Detach, Mailbox, NewRun, Reply, StepOut
from engine.server.websocket.outbox import Outbox
from engine.server.metrics.hub_metrics import HubMetrics
from engine.server.worker.prompt_prep import PromptPrep
from engine.server.websocket.step_history import StepHistory
from engine.server.port.ws_adapter import AsgiWebSocket
from engine.server.websocket.ws_connection import ClientConn, SharedFrames

log = logging.getLogger("kvscope.server")

PREP_WORKERS = 2


@dataclass(frozen=True, slots=True)
class HubLimits:
    max_frame_bytes: int = 1 << 20  # a prompt of ~250k tokens of text fits; a bigger frame is a bug
    step_buffer: int = 256  # unsent step messages per client before dropping (≈ seconds of steps)
    step_history: int = 1024  # steps kept for steps_since; older ones come from the recording
    # Unsent bytes (replies and steps) per connection before it is closed as not
    # reading: room for a snapshot of a 131k-block pool (~12 MB) several times over.
    max_outbox_bytes: int = 64 << 20
    # Kernel send buffer per connection. Linux autotunes it up to 4 MiB on loopback,
    # which would let a stalled client lag by thousands of steps inside the kernel
    # before the outbox bound (the part we control and count) kicks in.
    socket_send_buffer: int = 256 << 10
    max_in_flight: int = 64  # submits per connection being prepared, checked or run
    rate: RateLimit = RateLimit()  # inbound frames and bytes per connection (engine.server.websocket.frame_rate)


class Hub:
    def __init__(self, mailbox: Mailbox, metrics: HubMetrics, limits: HubLimits,
                 redact_tokens: bool = False) -> None:
        self.mailbox = mailbox
        # --redact-tokens: watchers get steps, steps_since answers and snapshots without
        # token ids (engine.events.redact); submitters still get their own outputs.
        self.redact_tokens = redact_tokens
        self._redacted: dict[int, tuple[Snapshot, Snapshot]] = {}  # per batch, by identity
        self.metrics = metrics
        self.limits = limits
        self.conns: dict[int, ClientConn] = {}
        self.history = StepHistory(limits.step_history)
        self.stopping = False
        self._tasks: set[asyncio.Task] = set()  # steps_since answers in progress
        self.frames = SharedFrames()  # one encoding per batch of a message many get
        self.prep: PromptPrep | None = None  # the current run's (from its NewRun delivery)
        # Prompts are tokenized here, never on the engine thread or the loop (tokenizers
        # release the GIL). Each connection has at most one prompt in the pool at a time
        # (Inbound prepares its submits one by one), so the pool's FIFO takes connections
        # in turn, and with two workers one slow prompt never holds up everyone's.
        self.workers = ThreadPoolExecutor(PREP_WORKERS, thread_name_prefix="kvscope-prep")
        metrics.watch_hub(lambda: len(self.conns), self.max_outbox_steps, self.max_outbox_bytes)

    def close(self) -> None:
        """Stop preparing submits (the server is shutting down; they would be refused)."""
        self.workers.shutdown(wait=False, cancel_futures=True)

    def max_outbox_steps(self) -> int:
        return max((c.outbox.num_steps for c in self.conns.values()), default=0)

    def max_outbox_bytes(self) -> int:
        return max((c.outbox.num_bytes for c in self.conns.values()), default=0)

    def pending_replies(self) -> int:
        return sum(c.outbox.num_replies for c in self.conns.values())

    # ---- connections ---------------------------------------------------------------

    async def handle(self, ws: AsgiWebSocket) -> None:
        """The websocket route's handler: runs for the life of one accepted connection."""
        conn = ClientConn(self.mailbox.new_sink_id(), ws,
                          Outbox(self.limits.step_buffer, self.limits.max_outbox_bytes), self.metrics,
                          frames=self.frames)
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.socket_send_buffer)
        self.conns[conn.id] = conn
        conn.writer = asyncio.create_task(conn.write(), name=f"kvscope-writer-{conn.id}")
        self.mailbox.send_lifecycle(conn, Attach())
        rate = FrameRate(self.limits.rate)
        try:
            async for frame in ws:
                pause = rate.charge(self._on_frame(conn, frame))
                if pause > 0.0:  # past its rate: its next frames wait in its own socket
                    self.metrics.throttled_seconds.inc(pause)
                    await asyncio.sleep(pause)
        except ConnectionClosed:
            pass  # includes 1009 for frames past the hard size limit
        finally:
            self.conns.pop(conn.id, None)
            self._inbound(conn).close()  # before the Detach: nothing of it may follow that
            conn.outbox.close()
            # Its requests are aborted: nobody is left to read their outputs.
            self.mailbox.send_lifecycle(conn, Detach())
            conn.writer.cancel()
            await asyncio.gather(conn.writer, return_exceptions=True)

    # ---- inbound ------------------------------------------------------------------------

    def _on_frame(self, conn: ClientConn, frame: str | bytes) -> int:
        """Answer or pass on one frame; its size in bytes (what it costs the rate)."""
        if isinstance(frame, bytes):
            conn.reply(Error(ErrorCode.BINARY_FRAME, "binary frames are not part of the protocol; "
                                                     "send JSON text frames"))
            return len(frame)
        size = len(frame.encode("utf-8"))
        if size > self.limits.max_frame_bytes:
            rid, op_name = _frame_ids(frame)  # so the submitter's wait ends with this reply
            conn.reply(Error(ErrorCode.TOO_LARGE, f"frame of {size} bytes is over the limit of "
                                                  f"{self.limits.max_frame_bytes}", rid, op_name))
            return size
        try:
            op = parse_op(frame)
        except ProtocolError as exc:
            conn.reply(Error.from_exc(exc))
            return size
        if isinstance(op, Ping):
            conn.reply(Pong(time.time()))
        elif isinstance(op, StepsSince):
            self._answer_steps(conn, op)
        else:
            self._inbound(conn).take(op)
        return size

    def _inbound(self, conn: ClientConn) -> Inbound:
        if conn.inbound is None:
            conn.inbound = Inbound(conn, self.mailbox, self.workers, lambda: self.prep,
                                   lambda: self.stopping, self.limits.max_in_flight)
        return conn.inbound

    def _answer_steps(self, conn: ClientConn, op: StepsSince) -> None:
        if conn.steps_pending:  # one at a time: each may read the database
            conn.reply(refusal(ErrorCode.BUSY, "a steps_since of this connection is still being "
                                                "answered", op))
            return
        conn.steps_pending = True

        async def answer() -> None:
            try:
                msg = await self.history.answer(op)
                if self.redact_tokens and isinstance(msg, Steps):
                    msg = replace(msg, steps=[redact_step(r) for r in msg.steps])
                conn.deliver(msg)
            finally:
                conn.steps_pending = False

        task = asyncio.ensure_future(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- outbound -------------------------------------------------------------------------

    def deliver(self, batch: list[Delivery]) -> None:
        """Apply one batch from the engine thread (called on the loop, in order)."""
        try:
            self._deliver(batch)
        finally:
            self.frames.clear()
            self._redacted.clear()

    def _deliver(self, batch: list[Delivery]) -> None:
        for d in batch:
            if isinstance(d, Reply):
                try:
                    d.sink.deliver(self._watched(d.item) if isinstance(d.item, Snapshot) else d.item)
                except Exception:  # one front door's fault must not cost the rest of the batch
                    log.exception("kvscope: delivering to sink %d failed", d.sink.id)
            elif isinstance(d, StepOut):
                self._broadcast_step(d)
            elif isinstance(d, NewRun):
                self.prep = d.prep or self.prep
                self.history.new_run(d.hello.run_id)
                self.metrics.start_run(d.hello.config)
                for conn in list(self.conns.values()):
                    if conn.attached:
                        conn.rebase(d.hello, self._watched(d.snapshot))
            else:
                raise TypeError(f"unknown delivery {d!r}")

    def _watched(self, snap: Snapshot) -> Snapshot:
        """``snap`` as watchers may see it (one redacted copy per batch, shared)."""
        if not self.redact_tokens:
            return snap
        hit = self._redacted.get(id(snap))
        if hit is None or hit[0] is not snap:
            hit = self._redacted[id(snap)] = (snap, replace(snap, state=redact_snapshot(snap.state)))
        return hit[1]

    def _broadcast_step(self, d: StepOut) -> None:
        self.metrics.observe_step(d.record)
        self.history.append(d.run_id, d.record)
        if not self.conns:
            return
        frame = encode(Step(redact_step(d.record) if self.redact_tokens else d.record))
        for conn in self.conns.values():
            if conn.attached:
                conn.put_step(frame)


def _frame_ids(frame: str) -> tuple[str | None, str | None]:
    """(request_id, op) of an oversized frame, when it is a JSON object naming them
    (bounded: websockets refuses frames past HARD_FRAME_FACTOR x the limit)."""
    try:
        d = json.loads(frame)
    except ValueError:
        return None, None
    if not isinstance(d, dict):
        return None, None
    rid, op = d.get("request_id"), d.get("type", d.get("op"))
    return (rid if isinstance(rid, str) else None), (op if isinstance(op, str) else None)

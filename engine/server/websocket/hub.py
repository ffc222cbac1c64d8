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

Both front doors (this one and the OpenAI API's ``ApiDesk``) go to the engine thread
through ``prepare`` and ``post``: one worker pool, one PromptPrep, one ``stopping`` flag,
and the same ``busy`` and ``shutting_down`` refusals.

Writer of: the connection table and the step history (loop thread only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from engine.protocol.codec import encode, parse_op
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.events.redact import redact_snapshot, redact_step
from engine.protocol.messages import Error, Pong, Snapshot, Step, Steps
from engine.protocol.ops import Op, Ping, StepsSince, Submit
from engine.server.websocket.frame_rate import FrameRate, RateLimit
from engine.server.websocket.inbound import Inbound, refused
from engine.server.worker.mailbox import Attach, Delivery, Detach, Mailbox, NewRun, Prepared, Reply, StepOut
from engine.server.websocket.outbox import Outbox
from engine.server.metrics.hub_metrics import HubMetrics
from engine.server.worker.prompt_prep import PromptPrep
from engine.server.worker.sink import Sink
from engine.server.websocket.step_history import StepHistory
from engine.server.port.ws_adapter import AsgiWebSocket
from engine.server.websocket.ws_connection import BatchMemo, ClientConn

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
        self._redacted = BatchMemo()  # watchers' copies of this batch's snapshots
        self.metrics = metrics
        self.limits = limits
        self.conns: dict[int, ClientConn] = {}
        self.history = StepHistory(limits.step_history)
        self.stopping = False
        self._tasks: set[asyncio.Task] = set()  # steps_since answers in progress
        self.frames = BatchMemo()  # one encoding per batch of a message many get
        self.prep: PromptPrep | None = None  # the current run's (from its NewRun delivery)
        # Prompts are tokenized here, never on the engine thread or the loop (tokenizers
        # release the GIL). Each connection has at most one prompt in the pool at a time
        # (Inbound prepares its submits one by one), so the pool's FIFO takes connections
        # in turn, and with two workers one slow prompt never holds up everyone's.
        self.workers = ThreadPoolExecutor(PREP_WORKERS, thread_name_prefix="kvscope-prep")
        metrics.watch_hub(lambda: len(self.conns), lambda: self._most("num_steps"),
                          lambda: self._most("num_bytes"))

    def close(self) -> None:
        """Stop preparing submits (the server is shutting down; they would be refused)."""
        self.workers.shutdown(wait=False, cancel_futures=True)

    def _most(self, outbox_figure: str) -> int:
        return max((getattr(c.outbox, outbox_figure) for c in self.conns.values()), default=0)

    def pending_replies(self) -> int:
        return sum(c.outbox.num_replies for c in self.conns.values())

    # ---- connections ---------------------------------------------------------------

    async def handle(self, ws: AsgiWebSocket) -> None:
        """The websocket route's handler: runs for the life of one accepted connection."""
        conn = ClientConn(self.mailbox.new_sink_id(), ws,
                          Outbox(self.limits.step_buffer, self.limits.max_outbox_bytes,
                                 self.metrics.dropped_steps.inc), self.metrics,
                          frames=self.frames)
        sock = ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.socket_send_buffer)
        self.conns[conn.id] = conn
        conn.writer = asyncio.create_task(conn.write(), name=f"kvscope-writer-{conn.id}")
        self.mailbox.send_lifecycle(conn, Attach())
        rate = FrameRate(self.limits.rate)
        try:
            async for frame in ws:  # ends when the peer goes (1009 for a frame past the hard limit)
                pause = rate.charge(self._on_frame(conn, frame))
                if pause > 0.0:  # past its rate: its next frames wait in its own socket
                    self.metrics.throttled_seconds.inc(pause)
                    await asyncio.sleep(pause)
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
            conn.inbound = Inbound(conn, self)
        return conn.inbound

    # ---- into the engine thread (both front doors) ------------------------------------

    async def prepare(self, op: Submit, how: Callable[[PromptPrep, Submit], Prepared] = PromptPrep.prepare
                      ) -> Submit | Prepared:
        """``op`` checked and tokenized by ``how`` in the worker pool (never on the loop or
        the engine thread; raises what ``how`` raises); ``op`` itself before the first
        run's PromptPrep arrives (the engine thread prepares it then) or once the server
        stops (``post`` refuses it then)."""
        if self.prep is None or self.stopping:
            return op
        try:
            return await asyncio.get_running_loop().run_in_executor(self.workers, how, self.prep, op)
        except RuntimeError:  # the pool is shut down: the server is stopping
            if not self.stopping:
                raise
            return op

    def post(self, sink: Sink, cmd: Op | Prepared) -> None:
        """Queue ``cmd`` for the engine thread; ProtocolError ``shutting_down`` once the
        server stops, ``busy`` when the engine thread's mailbox is full."""
        op = cmd.submit if isinstance(cmd, Prepared) else cmd
        if self.stopping:
            raise refused(ErrorCode.SHUTTING_DOWN, "the server is shutting down", op)
        if not self.mailbox.send(sink, cmd):
            raise refused(ErrorCode.BUSY, "the engine's command queue is full; retry shortly", op)

    def _answer_steps(self, conn: ClientConn, op: StepsSince) -> None:
        if conn.steps_pending:  # one at a time: each may read the database
            conn.reply(Error.from_exc(refused(ErrorCode.BUSY, "a steps_since of this connection "
                                                              "is still being answered", op)))
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
        finally:
            self.frames.clear()
            self._redacted.clear()

    def _watched(self, snap: Snapshot) -> Snapshot:
        """``snap`` as watchers may see it (one redacted copy per batch, shared)."""
        if not self.redact_tokens:
            return snap
        return self._redacted.get(snap, lambda s: replace(s, state=redact_snapshot(s.state)))

    def _broadcast_step(self, d: StepOut) -> None:
        self.metrics.observe_step(d.record)
        self.history.append(d.run_id, d.record)
        if not self.conns:
            return
        frame = encode(Step(redact_step(d.record) if self.redact_tokens else d.record))
        for conn in self.conns.values():
            if conn.attached:
                conn.outbox.put_step(frame)  # dropped (and counted) for a client too slow


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

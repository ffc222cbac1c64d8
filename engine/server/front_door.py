"""FrontDoor: the websocket + HTTP listener every kvscope server runs, around one worker.

``kvscope serve`` (``engine.server.app.KVScopeServer``, an engine thread) and
``kvscope attach`` (``engine.attach.server.AttachServer``, a thread fed by KV event
subscriptions) differ only in their worker. Both keep: one port for websockets,
``/healthz`` and ``/metrics``; the hub; the mailbox the worker reads; the recorder;
start in a thread or serve in the main one until SIGINT/SIGTERM; a graceful stop.

A subclass implements ``_start_work(post)`` (start the worker; ``post`` hands its
delivery batches to the hub on the loop) and ``_stop_work()`` (end it: its last
replies go out), and may override ``_prepare`` (open what must fail before the
port is bound), ``_abandon`` (undo it when binding failed) and ``_extra_health``.

Writer of: the port, the recorder, the loop's stop event (loop thread).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import serve

from engine.server.health import HealthBoard
from engine.server.http import HttpGate
from engine.server.hub import Hub, HubLimits
from engine.server.hub_metrics import HubMetrics
from engine.server.mailbox import Delivery, Mailbox
from engine.server.security import ALLOWED_ORIGINS

log = logging.getLogger("kvscope.server")

HARD_FRAME_FACTOR = 4  # frames up to 4x the limit get an error reply; beyond, websockets closes (1009)
Post = Callable[[list[Delivery]], None]


class FrontDoor:
    def __init__(self, *, host: str, port: int, db: str | None, record: bool, token: str | None,
                 max_frame_bytes: int, ping_interval: float | None, limits: HubLimits,
                 max_pending_ops: int, board: HealthBoard, metrics: HubMetrics,
                 redact_tokens: bool = False) -> None:
        self.host, self.requested_port, self.db, self.record = host, port, db, record
        self.token, self.max_frame_bytes, self.ping_interval = token, max_frame_bytes, ping_interval
        self.port: int | None = None
        self.board = board
        self.metrics = metrics
        self.mailbox = Mailbox(max_pending_ops)
        self.hub = Hub(self.mailbox, self.metrics, limits, redact_tokens=redact_tokens)
        self.recorder: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._bound = threading.Event()
        self._bind_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.on_bound: Callable[[], None] | None = None  # called once the port is bound (CLI banner)

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"ws://{host}:{self.port}"

    # ---- what a subclass supplies ------------------------------------------------------

    def _prepare(self) -> None:
        """Open what must fail the start before the port is bound."""

    def _abandon(self) -> None:
        """Undo ``_prepare`` after a failed bind."""

    def _extra_health(self) -> dict[str, Any]:
        return {}

    def _start_work(self, post: Post) -> None:
        raise NotImplementedError

    async def _stop_work(self) -> None:
        raise NotImplementedError

    def _describe(self) -> str:
        return f"listening on {self.url}"

    # ---- running ----------------------------------------------------------------------

    def start(self, timeout: float = 30.0):
        """Run in a background thread; returns once the port is bound."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self.run()),
                                        name=f"kvscope-{type(self).__name__}", daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout):
            raise TimeoutError("the server did not bind in time")
        if self._bind_error is not None:
            raise self._bind_error
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown from any thread; waits for it to complete."""
        loop, ev = self._loop, self._stop_event
        if loop is not None and ev is not None:
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass  # the loop already ended
        if self._thread is not None:
            self._thread.join(timeout)

    def serve_forever(self) -> int:
        """Run in this (main) thread until SIGINT/SIGTERM; returns the exit code."""
        return asyncio.run(self.run(install_signals=True))

    async def run(self, install_signals: bool = False) -> int:
        loop = self._loop = asyncio.get_running_loop()
        stop = self._stop_event = asyncio.Event()
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)

        def post(batch: list[Delivery]) -> None:
            try:
                loop.call_soon_threadsafe(self.hub.deliver, batch)
            except RuntimeError:
                pass  # the loop has closed: we are past shutdown

        try:
            self._prepare()
            gate = HttpGate(self.board, self.metrics, self.token,
                            lambda: {"connections": len(self.hub.conns),
                                     "uptime_s": round(time.time() - self.board.started, 3),
                                     **self._extra_health()})
            server = await serve(self.hub.handle, self.host, self.requested_port, process_request=gate,
                                 max_size=self.max_frame_bytes * HARD_FRAME_FACTOR,
                                 compression=None,  # deflate per client would cost CPU per broadcast
                                 origins=ALLOWED_ORIGINS, ping_interval=self.ping_interval,
                                 close_timeout=2.0)
        except BaseException as exc:
            self._abandon()
            self._bind_error = exc
            self._bound.set()
            raise
        try:
            async with server:
                self.port = server.sockets[0].getsockname()[1]
                if self.record:
                    from engine.store import Recorder, RunStore

                    self.recorder = Recorder(self.db)
                    self.hub.history.store = RunStore(self.recorder.path)
                    self.board.watch_recorder(self.recorder.health)
                    self.metrics.watch_recorder(self.recorder.health)
                self._start_work(post)
                self._bound.set()
                log.info("kvscope: %s", self._describe())
                if self.on_bound is not None:
                    self.on_bound()
                try:
                    await stop.wait()
                finally:
                    await self._shutdown()
        finally:
            if self.recorder is not None:  # flush what was queued, whatever stopped us
                ok = await asyncio.to_thread(self.recorder.close)
                log.info("kvscope: recorder closed (%s)", "complete" if ok else "INCOMPLETE")
        return 0

    async def _shutdown(self) -> None:
        log.info("kvscope: shutting down")
        self.hub.stopping = True
        await self._stop_work()
        self.hub.close()
        deadline = time.monotonic() + 1.0  # let final replies (finished/abort) reach clients
        while self.hub.pending_replies() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Leaving ``async with server`` closes every connection (1001) and waits for them.

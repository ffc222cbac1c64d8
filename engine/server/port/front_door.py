"""FrontDoor: the websocket + HTTP listener every kvscope server runs, around one worker.

``kvscope serve`` (``engine.server.app.KVScopeServer``) and ``kvscope attach``
(``engine.attach.server.AttachServer``) differ only in their worker (and serve adds the
OpenAI API). Both keep: one port (a Starlette app on uvicorn, see "Front doors" in
docs/architecture.md) for websockets, ``/healthz`` and ``/metrics``, behind
``http.HostCheck``; the hub; the mailbox the worker reads; the recorder; start in a
thread or serve in the main one until SIGINT/SIGTERM; a graceful stop.

A subclass implements ``_start_work(post)`` (start the worker; ``post`` hands its
delivery batches to the hub on the loop) and ``_stop_work()`` (end it: its last
replies go out), and may override ``_prepare`` (open what must fail before the
port is bound), ``_abandon`` (undo it when binding failed), ``_extra_health``,
``_routes`` (more HTTP routes on the port) and ``_open_calls`` (HTTP calls whose
last answer shutdown should wait for, like unsent websocket replies).

Writer of: the port, the recorder, the loop's stop event (loop thread).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from engine.server.port.handoff import LoopHandoff
from engine.server.worker.health import HealthBoard
from engine.server.port.http import Gate, HostCheck, route_error
from engine.server.websocket.hub import Hub, HubLimits
from engine.server.metrics.hub_metrics import HubMetrics
from engine.server.worker.mailbox import Delivery, Mailbox
from engine.server.port.security import HostPolicy
from engine.server.port.ws_adapter import TransportWebSocketProtocol

log = logging.getLogger("kvscope.server")

HARD_FRAME_FACTOR = 4  # frames up to 4x the limit get an error reply; beyond, websockets closes (1009)
PING_TIMEOUT_S = 20.0  # websockets' default: a peer that does not answer a ping in time is dropped
GRACEFUL_HTTP_S = 5  # after the worker stopped, how long HTTP responses in flight may take to end
Post = Callable[[list[Delivery]], None]


class FrontDoor:
    def __init__(self, *, host: str, port: int, db: str | None, record: bool, token: str | None,
                 ping_interval: float | None, limits: HubLimits,
                 max_pending_ops: int, board: HealthBoard, metrics: HubMetrics,
                 redact_tokens: bool = False, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.host, self.requested_port, self.db, self.record = host, port, db, record
        self.token, self.ping_interval = token, ping_interval
        self.port: int | None = None
        self.host_policy = HostPolicy.for_bind(host, allowed_hosts)
        self.board = board
        self.metrics = metrics
        self.mailbox = Mailbox(max_pending_ops)
        self.hub = Hub(self.mailbox, self.metrics, limits, redact_tokens=redact_tokens)
        self.gate = Gate(board, metrics, token,
                         lambda: {"connections": len(self.hub.conns),
                                  "uptime_s": round(time.time() - self.board.started, 3),
                                  **self._extra_health()})
        self.recorder: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._bound = threading.Event()
        self._bind_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.on_bound: Callable[[], None] | None = None  # called once the port is bound (CLI banner)

    @property
    def url(self) -> str:
        return f"ws://{self._hostport}"

    @property
    def _hostport(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{host}:{self.port}"

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

    def _routes(self) -> list[BaseRoute]:
        """HTTP routes besides the gate's own."""
        return []

    def _open_calls(self) -> int:
        """HTTP calls still being answered (shutdown gives them the same second as replies)."""
        return 0

    def asgi_app(self) -> Starlette:
        """The one app behind the port."""
        return Starlette(routes=self.gate.routes(self.hub) + self._routes(),
                         middleware=[Middleware(HostCheck, policy=self.host_policy)],
                         exception_handlers={HTTPException: route_error})

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

        post = LoopHandoff(loop, self.hub.deliver).post

        try:
            self._prepare()
            sock = _listen(self.host, self.requested_port)
            http = self._http_server()
            await http.startup(sockets=[sock])
        except BaseException as exc:
            self._abandon()
            self._bind_error = exc
            self._bound.set()
            raise
        try:
            self.port = sock.getsockname()[1]
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
                await http.shutdown(sockets=[sock])
        finally:
            if self.recorder is not None:  # flush what was queued, whatever stopped us
                ok = await asyncio.to_thread(self.recorder.close)
                log.info("kvscope: recorder closed (%s)", "complete" if ok else "INCOMPLETE")
        return 0

    async def _shutdown(self) -> None:
        log.info("kvscope: shutting down")
        self.hub.stopping = True  # both front doors refuse new work from here on
        await self._stop_work()
        self.hub.close()
        deadline = time.monotonic() + 1.0  # let final replies (finished/abort) reach clients
        while (self.hub.pending_replies() or self._open_calls()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        conns = list(self.hub.conns.values())
        await asyncio.gather(*(c.ws.close(1001, "server shutting down") for c in conns),
                             return_exceptions=True)
        # The HTTP server's own shutdown (after this) ends idle keep-alive connections and
        # waits up to GRACEFUL_HTTP_S for responses still being written.

    def _http_server(self) -> uvicorn.Server:
        config = uvicorn.Config(
            self.asgi_app(), http="h11", ws=TransportWebSocketProtocol, lifespan="off",
            ws_max_size=self.hub.limits.max_frame_bytes * HARD_FRAME_FACTOR,
            ws_per_message_deflate=False,  # deflate per client would cost CPU per broadcast
            ws_ping_interval=self.ping_interval, ws_ping_timeout=PING_TIMEOUT_S,
            log_config=None, access_log=False, server_header=False,
            timeout_graceful_shutdown=GRACEFUL_HTTP_S)
        config.load()
        server = uvicorn.Server(config)
        # What Server.serve() does before startup(); serve() itself is not used because it
        # installs its own SIGINT/SIGTERM handlers and re-raises them after shutdown.
        server.lifespan = config.lifespan_class(config)
        return server


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket (bound here, so a taken port is an OSError for the caller).

    Made with ``proto=IPPROTO_TCP`` on purpose: accepted sockets inherit it, and asyncio
    turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP. From
    ``socket.create_server`` (proto 0) every connection kept Nagle on, and each small
    frame after the first waited for the client's delayed ACK (~40 ms): a stream of
    steps or SSE chunks arrived in bursts, tens of milliseconds late."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server does
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock

"""KVScopeServer: one engine thread + one HTTP/websocket server (uvicorn) on one port.

The port answers the websocket protocol v2 (the dashboard, ``kvscope submit``),
``/healthz``, ``/metrics`` and the OpenAI API (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``, ``/reset_prefix_cache``): a Starlette app on uvicorn, whose
websockets run on the ``websockets`` package (sans-I/O). Both front doors are sinks
of the one engine thread's mailbox (a websocket connection, an API call): they send
protocol ops, and ``Hub.deliver`` hands each answer to its sink, whichever door.

The port is bound at once and the model loads in the background (``/healthz``
says ``loading``; websocket handshakes and API calls get 503 until it is ready).
Shutdown (``stop()``, SIGINT, SIGTERM): stop taking ops and calls, abort live
requests (websocket submitters get ``finished`` with reason ``abort``, API streams
end with it), publish the last events, mark the run finished, let the replies go
out (<= 1 s), close every websocket (1001), stop the HTTP server, then flush and
close the recorder.

    server = KVScopeServer(ServerOptions(EngineConfig(model=path), port=0)).start()
    server.wait_ready(); print(server.url, server.http_url); ...; server.stop()
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from engine.config import EngineConfig
from engine.openai.errors import ApiError
from engine.openai.request import ParseLimits
from engine.server.api_desk import ApiDesk
from engine.server.api_routes import ApiContext, api_routes, error_response
from engine.server.engine_loop import EngineFactory, EngineWorker
from engine.server.health import Health, HealthBoard, Status
from engine.server.http import Gate, not_found
from engine.server.hub import Hub, HubLimits
from engine.server.mailbox import Delivery, Mailbox, Shutdown
from engine.server.prom import ServerMetrics
from engine.server.request_book import MAX_N
from engine.server.security import BindRefused, check_bind
from engine.server.ws_adapter import TransportWebSocketProtocol

log = logging.getLogger("kvscope.server")

HARD_FRAME_FACTOR = 4  # frames up to 4x the limit get an error reply; beyond, websockets closes (1009)
PING_TIMEOUT_S = 20.0  # websockets' default: a peer that does not answer a ping in time is dropped
GRACEFUL_HTTP_S = 5  # after the engine stopped, how long HTTP responses in flight may take to end


@dataclass(frozen=True, slots=True)
class ServerOptions:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port (see KVScopeServer.port)
    db: str | None = None  # None: $KVSCOPE_DB or data/runs.sqlite
    record: bool = True
    label: str | None = None
    allow_remote: bool = False
    token: str | None = None  # from KVSCOPE_TOKEN; required of clients when set
    max_frame_bytes: int = 1 << 20
    max_in_flight_per_conn: int = 64
    max_pending_ops: int = 1024  # client ops queued for the engine thread, all connections
    step_buffer: int = 256
    step_history: int = 1024  # steps kept for steps_since; older ones are read from the recording
    ping_interval: float | None = 20.0
    engine_factory: EngineFactory | None = None  # tests: control how (and when) the engine loads
    # vLLM's --served-model-name: the names the API answers to; the first labels the
    # metrics (model_name). Empty: the model's name (--model), as in vLLM.
    served_model_name: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = self.served_model_name
        names = (names,) if isinstance(names, str) else names
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"served_model_name must be non-empty names, got {self.served_model_name!r}")
        object.__setattr__(self, "served_model_name", tuple(names))
        for name in ("max_frame_bytes", "max_in_flight_per_conn", "max_pending_ops", "step_buffer",
                     "step_history"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port!r}")
        check_bind(self.host, self.allow_remote, self.token)
        kv = self.engine.kv_events_config
        exposed = kv.network_binds() if kv is not None else []
        if exposed and not self.allow_remote:
            raise BindRefused(f"refusing to bind KV events on {', '.join(exposed)}: that streams prompt "
                              f"token ids, unauthenticated, to anyone who can reach it. Pass --allow-remote "
                              f"to allow it, or keep to this machine (ipc://PATH, a tcp://127.0.0.1 "
                              f"replay_endpoint, or connect out to a subscriber's tcp://HOST:PORT).")

    @property
    def model_name(self) -> str:
        """The served model name: the first --served-model-name, else --model."""
        return self.served_model_name[0] if self.served_model_name else self.engine.model

    def limits(self) -> dict[str, Any]:
        """The bounds a client may want to know (sent in ``hello.limits``)."""
        return {"max_frame_bytes": self.max_frame_bytes,
                "max_in_flight_per_connection": self.max_in_flight_per_conn,
                "max_queue": self.engine.max_waiting, "step_buffer": self.step_buffer,
                "max_n": MAX_N}


class KVScopeServer:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.port: int | None = None
        self.board = HealthBoard(options.engine.model)
        self.metrics = ServerMetrics(options.model_name)
        self.metrics.watch_config(lambda: self.board.current.config)
        self.mailbox = Mailbox(options.max_pending_ops)
        self.hub = Hub(self.mailbox, self.metrics,
                       HubLimits(options.max_frame_bytes, options.step_buffer, options.step_history))
        self.desk = ApiDesk(self.mailbox, self._engine_alive)
        self.gate = Gate(self.board, self.metrics, options.token,
                         lambda: {"connections": len(self.hub.conns),
                                  "api_calls": len(self.desk.exchanges),
                                  "served_model_name": options.model_name,
                                  "uptime_s": round(time.time() - self.board.started, 3)})
        self.recorder: Any = None
        self.worker: EngineWorker | None = None
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
    def http_url(self) -> str:
        """Base URL of the OpenAI API (what an OpenAI client takes as ``base_url``)."""
        return f"http://{self._hostport}/v1"

    @property
    def _hostport(self) -> str:
        host = self.options.host if ":" not in self.options.host else f"[{self.options.host}]"
        return f"{host}:{self.port}"

    def _engine_alive(self) -> bool:
        w = self.worker
        return w is not None and (w.is_alive() or self.board.current.status is Status.LOADING)

    def asgi_app(self) -> Starlette:
        """The one app behind the port: the server's own routes and the OpenAI API."""
        opts = self.options
        ctx = ApiContext(self.desk, self.board, self.gate,
                         ParseLimits(max_n=MAX_N, max_prompts=opts.max_in_flight_per_conn),
                         opts.max_frame_bytes, opts.served_model_name or (opts.engine.model,))
        return Starlette(routes=self.gate.routes(self.hub) + api_routes(ctx),
                         exception_handlers={ApiError: error_response, HTTPException: not_found})

    @property
    def health(self) -> Health:
        return self.board.current

    # ---- running ----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> KVScopeServer:
        """Run in a background thread; returns once the port is bound (not loaded)."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="kvscope-server",
                                        daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout):
            raise TimeoutError("the server did not bind in time")
        if self._bind_error is not None:
            raise self._bind_error
        return self

    def wait_ready(self, timeout: float = 60.0) -> Health:
        """Block until the model is loaded (or failed to load); returns the health."""
        deadline = time.monotonic() + timeout
        while self.board.current.status is Status.LOADING:
            if time.monotonic() > deadline:
                raise TimeoutError(f"still loading after {timeout}s: {self.board.current.detail}")
            time.sleep(0.02)
        return self.board.current

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
        opts = self.options

        def post(batch: list[Delivery]) -> None:
            try:
                loop.call_soon_threadsafe(self.hub.deliver, batch)
            except RuntimeError:
                pass  # the loop has closed: we are past shutdown

        try:
            sock = _listen(opts.host, opts.port)
            http = _http_server(self.asgi_app(), opts)
            await http.startup(sockets=[sock])
        except BaseException as exc:
            self._bind_error = exc
            self._bound.set()
            raise
        try:
            self.port = sock.getsockname()[1]
            if opts.record:
                from engine.store import Recorder, RunStore

                self.recorder = Recorder(opts.db)
                self.hub.history.store = RunStore(self.recorder.path)
                self.board.watch_recorder(self.recorder.health)
                self.metrics.watch_recorder(self.recorder.health)
            self.worker = EngineWorker(opts.engine, post, self.mailbox, self.board,
                                       self.recorder, opts.label, opts.max_in_flight_per_conn,
                                       opts.limits(), opts.engine_factory)
            self.worker.start()
            self._bound.set()
            log.info("kvscope: listening on %s and %s (loading %s)", self.url, self.http_url,
                     opts.engine.model)
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
        self.hub.stopping = self.desk.stopping = self.gate.stopping = True
        worker = self.worker
        if worker is not None:
            worker.stop_requested.set()
            self.mailbox.send_lifecycle(None, Shutdown())
            if self.board.current.status is not Status.LOADING:
                await asyncio.to_thread(worker.join, 30.0)
        deadline = time.monotonic() + 1.0  # let final replies (finished/abort) reach clients
        while (self.hub.pending_replies() or self.desk.exchanges) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        conns = list(self.hub.conns.values())
        await asyncio.gather(*(c.ws.close(1001, "server shutting down") for c in conns),
                             return_exceptions=True)
        # The HTTP server's own shutdown (after this) ends idle keep-alive connections and
        # waits up to GRACEFUL_HTTP_S for responses still being written.


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket (bound here, so a taken port is an OSError for the caller)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host.strip("[]"), port), family=family, backlog=2048)
    sock.setblocking(False)
    return sock


def _http_server(app: Starlette, opts: ServerOptions) -> uvicorn.Server:
    config = uvicorn.Config(
        app, http="h11", ws=TransportWebSocketProtocol, lifespan="off",
        ws_max_size=opts.max_frame_bytes * HARD_FRAME_FACTOR,
        ws_per_message_deflate=False,  # deflate per client would cost CPU per broadcast
        ws_ping_interval=opts.ping_interval, ws_ping_timeout=PING_TIMEOUT_S,
        log_config=None, access_log=False, server_header=False,
        timeout_graceful_shutdown=GRACEFUL_HTTP_S)
    config.load()
    server = uvicorn.Server(config)
    # What Server.serve() does before startup(); serve() itself is not used because it
    # installs its own SIGINT/SIGTERM handlers and re-raises them after shutdown.
    server.lifespan = config.lifespan_class(config)
    return server


__all__ = ["BindRefused", "KVScopeServer", "ServerOptions"]

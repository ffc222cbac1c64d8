"""KVScopeServer: one engine thread + one websockets server on one port.

The port is bound at once and the model loads in the background (``/healthz``
says ``loading`` and websocket handshakes get 503 until it is ready). Shutdown
(``stop()``, SIGINT, SIGTERM): stop taking ops, abort live requests (their
submitters get ``finished`` with reason ``abort``), publish the last events,
mark the run finished, let the replies go out (≤ 1 s), close every connection
(1001), then flush and close the recorder.

    server = KVScopeServer(ServerOptions(EngineConfig(model=path), port=0)).start()
    server.wait_ready(); print(server.url); ...; server.stop()
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import serve

from engine.config import EngineConfig
from engine.server.engine_loop import EngineFactory, EngineWorker
from engine.server.health import Health, HealthBoard, Status
from engine.server.http import HttpGate
from engine.server.hub import Hub, HubLimits
from engine.server.mailbox import Delivery, Mailbox, Shutdown
from engine.server.prom import ServerMetrics
from engine.server.request_book import MAX_N
from engine.server.security import ALLOWED_ORIGINS, BindRefused, check_bind

log = logging.getLogger("kvscope.server")

HARD_FRAME_FACTOR = 4  # frames up to 4x the limit get an error reply; beyond, websockets closes (1009)


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
        host = self.options.host if ":" not in self.options.host else f"[{self.options.host}]"
        return f"ws://{host}:{self.port}"

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
            gate = HttpGate(self.board, self.metrics, opts.token,
                            lambda: {"connections": len(self.hub.conns),
                                     "uptime_s": round(time.time() - self.board.started, 3)})
            server = await serve(self.hub.handle, opts.host, opts.port, process_request=gate,
                                 max_size=opts.max_frame_bytes * HARD_FRAME_FACTOR,
                                 compression=None,  # deflate per client would cost CPU per broadcast
                                 origins=ALLOWED_ORIGINS, ping_interval=opts.ping_interval,
                                 close_timeout=2.0)
        except BaseException as exc:
            self._bind_error = exc
            self._bound.set()
            raise
        try:
            async with server:
                self.port = server.sockets[0].getsockname()[1]
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
                log.info("kvscope: listening on %s (loading %s)", self.url, opts.engine.model)
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
        worker = self.worker
        if worker is not None:
            worker.stop_requested.set()
            self.mailbox.send_lifecycle(None, Shutdown())
            if self.board.current.status is not Status.LOADING:
                await asyncio.to_thread(worker.join, 30.0)
        deadline = time.monotonic() + 1.0  # let final replies (finished/abort) reach clients
        while self.hub.pending_replies() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Leaving ``async with server`` closes every connection (1001) and waits for them.


__all__ = ["BindRefused", "KVScopeServer", "ServerOptions"]

"""KVScopeServer: one engine behind one port (``engine.server.port.front_door``).

The engine runs in an ``EngineWorker``, a thread of this process; its core (scheduler
and model) runs in this process or, as ``kvscope serve`` runs it
(``EngineConfig.engine_core_process``), in a process of its own, so that no client's
traffic holds its GIL and this process never imports torch (``engine.engine_core``).

The port's routes and how both front doors reach the engine thread's mailbox:
docs/architecture.md, "Front doors".

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
import os
import time
from dataclasses import dataclass
from typing import Any

from starlette.routing import BaseRoute

from engine.config import EngineConfig
from engine.openai.request import ParseLimits
from engine.server.api.api_desk import ApiDesk
from engine.server.api.api_routes import ApiContext, api_routes
from engine.server.api.client_quota import DEFAULT_MAX_API_IN_FLIGHT, ClientQuota
from engine.server.worker.engine_loop import EngineFactory, EngineWorker
from engine.server.port.front_door import FrontDoor, Post
from engine.server.worker.health import Health, HealthBoard, Status
from engine.server.websocket.frame_rate import BYTE_BURST, BYTES_PER_S, FRAME_BURST, FRAMES_PER_S, RateLimit
from engine.server.websocket.hub import HubLimits
from engine.server.worker.mailbox import Shutdown
from engine.server.metrics.prom import ServerMetrics
from engine.server.worker.request_book import MAX_N
from engine.server.port.security import BindRefused, check_allowed_hosts, check_bind


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
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host: Host names answered besides loopback ones
    max_frame_bytes: int = 1 << 20
    max_in_flight_per_conn: int = 64
    max_api_in_flight: int = DEFAULT_MAX_API_IN_FLIGHT  # per client address, over the OpenAI API
    max_pending_ops: int = 1024  # client ops queued for the engine thread, all connections
    step_buffer: int = 256
    step_history: int = 1024  # steps kept for steps_since; older ones are read from the recording
    max_outbox_bytes: int = 64 << 20  # unsent bytes per connection before it is closed (slow_client)
    # inbound rate per websocket connection (engine.server.websocket.frame_rate); 0: no bound
    max_frames_per_s: float = FRAMES_PER_S
    max_inbound_bytes_per_s: float = BYTES_PER_S
    client_restart: bool = True  # False: ``restart`` is refused (restart_disabled)
    redact_tokens: bool = False  # watchers get no token ids (engine.events.redact)
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
        object.__setattr__(self, "allowed_hosts", check_allowed_hosts(self.allowed_hosts))
        for name in ("max_frame_bytes", "max_in_flight_per_conn", "max_api_in_flight", "max_pending_ops",
                     "step_buffer", "step_history", "max_outbox_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.rate_limit()  # raises on a bad rate
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

    def rate_limit(self) -> RateLimit:
        """Each connection's inbound bound: the burst of bytes lets two of the largest
        frames through at once."""
        return RateLimit(self.max_frames_per_s, FRAME_BURST, self.max_inbound_bytes_per_s,
                         max(BYTE_BURST, 2 * self.max_frame_bytes))

    def limits(self) -> dict[str, Any]:
        """The bounds a client may want to know (sent in ``hello.limits``)."""
        return {"max_frame_bytes": self.max_frame_bytes,
                "max_in_flight_per_connection": self.max_in_flight_per_conn,
                "max_queue": self.engine.max_waiting, "step_buffer": self.step_buffer,
                "max_outbox_bytes": self.max_outbox_bytes, "max_n": MAX_N,
                "max_frames_per_s": self.max_frames_per_s,
                "max_inbound_bytes_per_s": self.max_inbound_bytes_per_s,
                "redact_tokens": self.redact_tokens, "client_restart": self.client_restart}


class KVScopeServer(FrontDoor):
    def __init__(self, options: ServerOptions) -> None:
        super().__init__(host=options.host, port=options.port, db=options.db, record=options.record,
                         token=options.token, ping_interval=options.ping_interval,
                         limits=HubLimits(options.max_frame_bytes, options.step_buffer,
                                          options.step_history, options.max_outbox_bytes,
                                          max_in_flight=options.max_in_flight_per_conn,
                                          rate=options.rate_limit()),
                         redact_tokens=options.redact_tokens, allowed_hosts=options.allowed_hosts,
                         max_pending_ops=options.max_pending_ops,
                         board=HealthBoard(options.engine.model),
                         metrics=ServerMetrics(options.model_name))
        self.options = options
        self.metrics.watch_config(lambda: self.board.current.config)
        self.metrics.watch_faults(lambda: self.board.faults)
        self.worker: EngineWorker | None = None
        self.desk = ApiDesk(self.hub, self._engine_alive)

    @property
    def http_url(self) -> str:
        """Base URL of the OpenAI API (what an OpenAI client takes as ``base_url``)."""
        return f"http://{self._hostport}/v1"

    @property
    def health(self) -> Health:
        return self.board.current

    def wait_ready(self, timeout: float = 60.0) -> Health:
        """Block until the model is loaded (or failed to load); returns the health."""
        deadline = time.monotonic() + timeout
        while self.board.current.status is Status.LOADING:
            if time.monotonic() > deadline:
                raise TimeoutError(f"still loading after {timeout}s: {self.board.current.detail}")
            time.sleep(0.02)
        return self.board.current

    def _describe(self) -> str:
        return f"listening on {self.url} and {self.http_url} (loading {self.options.engine.model})"

    def _engine_alive(self) -> bool:
        w = self.worker
        return w is not None and (w.alive() or self.board.current.status is Status.LOADING)

    def _routes(self) -> list[BaseRoute]:
        opts = self.options
        return api_routes(ApiContext(
            self.desk, self.board, self.gate,
            ParseLimits(max_n=MAX_N, max_prompts=opts.max_in_flight_per_conn),
            opts.max_frame_bytes, opts.served_model_name or (opts.engine.model,),
            ClientQuota(opts.max_api_in_flight)))

    def _open_calls(self) -> int:
        return len(self.desk.exchanges)

    def _extra_health(self) -> dict[str, Any]:
        return {"api_calls": len(self.desk.exchanges), "served_model_name": self.options.model_name,
                "engine": {"process": self.options.engine.engine_core_process, "pid": self._core_pid()}}

    def _core_pid(self) -> int:
        """The engine core's process id: its own process's, or this one's."""
        engine = self.worker.engine if self.worker is not None else None
        return (engine.core.pid if engine is not None else None) or os.getpid()

    def _start_work(self, post: Post) -> None:
        opts = self.options
        self.worker = EngineWorker(opts.engine, post, self.mailbox, self.board, self.recorder,
                                   opts.label, opts.max_in_flight_per_conn, opts.limits(),
                                   opts.engine_factory, client_restart=opts.client_restart)
        self.worker.start()

    async def _stop_work(self) -> None:
        worker = self.worker
        if worker is not None:
            worker.stop_requested.set()
            self.mailbox.send_lifecycle(None, Shutdown())
            if self.board.current.status is not Status.LOADING:
                await asyncio.to_thread(worker.join, 30.0)
            elif self.options.engine.engine_core_process:  # loading: the core's process is killed
                await asyncio.to_thread(worker.join, 10.0)


__all__ = ["BindRefused", "KVScopeServer", "ServerOptions"]

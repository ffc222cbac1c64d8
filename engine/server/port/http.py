"""The serve port's own routes (Starlette): health, metrics, and the websocket door.

- ``GET /healthz``: JSON ``{"status": "loading"|"ready"|"degraded"|"error"|"stopping", "detail", ...}``;
  200, except 503 after a failed load (so ``curl -f`` fails). No token needed.
- ``GET /metrics``: Prometheus text (token needed when one is set).
- A websocket on ``/`` (or ``/ws``) is accepted when its Origin is allowed (403
  otherwise), the token matches (401) and the engine serves (ready, or degraded: a
  recorder problem): while the model
  loads (or after a failed load, or while stopping) the handshake is refused with
  HTTP 503 and the health JSON, so a client knows to retry. Accepted, it is the
  Hub's for its life (protocol v2, unchanged).
- ``GET /`` without an upgrade: a line saying what this port is.
- ``HEAD``, 405 with ``Allow``, 404, and before any route the Host check (``HostCheck``,
  403): as "Front doors" in docs/architecture.md says; in OpenAI's error shape on the
  API's paths (``/v1...``, ``/reset_prefix_cache``), ``{"error", "detail"}`` elsewhere.

The OpenAI routes (``engine.server.api.api_routes``) share ``Gate`` for the token and Origin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from engine.openai.errors import ApiError
from engine.server.worker.health import HealthBoard, Status
from engine.server.websocket.hub import Hub
from engine.server.metrics.hub_metrics import HubMetrics
from engine.server.metrics.prom import CONTENT_TYPE
from engine.server.port.security import HostPolicy, origin_allowed, token_ok
from engine.server.port.ws_adapter import AsgiWebSocket

WS_PATHS = ("/", "/ws")
UNAUTHORIZED = {"error": "unauthorized", "detail": "present the server token as ?token= or "
                                                   "Authorization: Bearer"}
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="kvscope"'}


class Gate:
    """Who may use the port: the token, the Origin, and whether the engine is ready."""

    def __init__(self, board: HealthBoard, metrics: HubMetrics, token: str | None,
                 extra_health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.board = board
        self.metrics = metrics
        self.token = token
        self.extra_health = extra_health or dict

    def authorized(self, conn: HTTPConnection) -> bool:
        query = conn.scope.get("query_string", b"").decode("latin-1")
        return token_ok(self.token, "?" + query, conn.headers.get("authorization"))

    @staticmethod
    def origin_ok(conn: HTTPConnection) -> bool:
        return origin_allowed(conn.headers.get("origin"))

    # ---- routes ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        health = self.board.current
        payload = {**health.to_dict(), **self.extra_health()}
        return JSONResponse(payload, 503 if health.status is Status.ERROR else 200)

    async def metrics_page(self, request: Request) -> Response:
        if not self.authorized(request):
            return JSONResponse(UNAUTHORIZED, 401, CHALLENGE)
        return Response(self.metrics.render(), 200, media_type=CONTENT_TYPE)

    async def index(self, request: Request) -> Response:
        if not self.authorized(request):
            return JSONResponse(UNAUTHORIZED, 401, CHALLENGE)
        return PlainTextResponse("kvscope server: connect a websocket client to this URL, or an "
                                 "OpenAI client to /v1; see /healthz and /metrics\n")

    def websocket_door(self, hub: Hub) -> Callable[[WebSocket], Any]:
        async def door(ws: WebSocket) -> None:
            if not self.origin_ok(ws):
                await ws.close()  # before accept: the handshake gets 403
                return
            if not self.authorized(ws):
                await ws.send_denial_response(JSONResponse(UNAUTHORIZED, 401, CHALLENGE))
                return
            health = self.board.current
            if not health.serving or hub.stopping:
                # Refused rather than accepted-then-closed: a client sees 503 during the
                # handshake and retries, with no half-open session to clean up.
                await ws.send_denial_response(JSONResponse(health.to_dict(), 503))
                return
            await ws.accept()
            await hub.handle(AsgiWebSocket(ws))

        return door

    def routes(self, hub: Hub) -> list[BaseRoute]:
        door = self.websocket_door(hub)
        return [Route("/healthz", self.healthz, methods=["GET", "HEAD"]),
                Route("/metrics", self.metrics_page, methods=["GET", "HEAD"]),
                *(WebSocketRoute(p, door) for p in WS_PATHS),
                *(Route(p, self.index, methods=["GET", "HEAD"]) for p in WS_PATHS)]


def is_api_path(path: str) -> bool:
    """The OpenAI API's paths (vLLM's ``/reset_prefix_cache`` with them): their errors
    come in OpenAI's shape."""
    return path == "/v1" or path.startswith("/v1/") or path == "/reset_prefix_cache"


def api_error_body(message: str, code: str) -> dict[str, Any]:
    return ApiError(0, message, code=code).body()  # OpenAI's shape, as the API's own errors


async def route_error(request: Request, exc: Exception) -> Response:
    """404 for a path no route has, 405 (with ``Allow``) for a method its route does not take."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    path, method = request.url.path, request.method
    headers: dict[str, str] = {}
    if status == 405:
        given = (getattr(exc, "headers", None) or {}).get("Allow", "")
        # sorted: Starlette joins a set, whose order changes from one process to the next
        allow = ", ".join(sorted(m.strip() for m in given.split(",") if m.strip()))
        headers["Allow"] = allow
        what, code = f"{method} is not allowed on {path}; it takes {allow}", "method_not_allowed"
    else:
        what, code = f"no such route: {method} {path}", "not_found"
    if is_api_path(path):
        return JSONResponse(api_error_body(what, code), status, headers)
    if status == 404:
        what += "; try /healthz, /metrics, /v1 or a websocket on /"
    return JSONResponse({"error": code, "detail": what}, status, headers)


class HostCheck:
    """ASGI middleware: refuse (403) HTTP requests and websocket handshakes whose Host
    header the policy does not allow, before any route or token check runs."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.policy.check:
            host = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k == b"host"), None)
            if not self.policy.allows(host):
                message = self.policy.refusal(host)
                body = (api_error_body(message, "host_not_allowed") if is_api_path(scope.get("path", ""))
                        else {"error": "host_not_allowed", "detail": message})
                response = JSONResponse(body, 403)
                if scope["type"] == "websocket":
                    await WebSocket(scope, receive, send).send_denial_response(response)
                else:
                    await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

"""Plain HTTP on the websocket port, via websockets' ``process_request`` hook.

- ``GET /healthz``: JSON ``{"status": "loading"|"ready"|"degraded"|"error"|"stopping", "detail", ...}``;
  200, except 503 after a failed load (so ``curl -f`` fails). No token needed.
- ``GET /metrics``: Prometheus text (token needed when one is set).
- A websocket handshake on ``/`` (or ``/ws``) passes when the token matches and
  the engine is ready. While the model loads (or after a failed load) it is
  refused with HTTP 503 and the health JSON, so a client knows to retry.
"""

from __future__ import annotations

import http
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from engine.server.health import HealthBoard, Status
from engine.server.prom import CONTENT_TYPE, ServerMetrics
from engine.server.security import token_ok

WS_PATHS = ("/", "/ws")


def _respond(connection: ServerConnection, status: int, body: str | bytes, content_type: str) -> Response:
    text = body.decode() if isinstance(body, bytes) else body
    resp = connection.respond(status, text)
    del resp.headers["Content-Type"]  # respond() sets text/plain; Headers is a multidict
    resp.headers["Content-Type"] = content_type
    return resp


def _json(connection: ServerConnection, status: int, payload: dict[str, Any]) -> Response:
    return _respond(connection, status, json.dumps(payload) + "\n", "application/json")


class HttpGate:
    """The ``process_request`` hook: answers HTTP paths and gates websocket handshakes."""

    def __init__(self, board: HealthBoard, metrics: ServerMetrics, token: str | None,
                 extra_health: Callable[[], dict[str, Any]] | None = None) -> None:
        self.board = board
        self.metrics = metrics
        self.token = token
        self.extra_health = extra_health or dict

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        auth = request.headers.get("Authorization")
        if path == "/healthz":
            health = self.board.current
            payload = {**health.to_dict(), **self.extra_health()}
            return _json(connection, 503 if health.status is Status.ERROR else 200, payload)
        if not token_ok(self.token, request.path, auth):
            resp = _json(connection, http.HTTPStatus.UNAUTHORIZED,
                         {"error": "unauthorized", "detail": "present the server token as ?token= "
                                                             "or Authorization: Bearer"})
            resp.headers["WWW-Authenticate"] = 'Bearer realm="kvscope"'
            return resp
        if path == "/metrics":
            return _respond(connection, 200, self.metrics.render(), CONTENT_TYPE)
        if path not in WS_PATHS:
            return _json(connection, 404, {"error": "not_found", "detail": f"no {path!r}; try /healthz, "
                                                                           f"/metrics or a websocket on /"})
        if "websocket" not in request.headers.get("Upgrade", "").lower():
            return _respond(connection, 200, "kvscope server: connect a websocket client to this URL; "
                                             "see /healthz and /metrics\n", "text/plain; charset=utf-8")
        health = self.board.current
        if not health.serving:  # ready, or degraded (a recorder problem): both serve
            # Refused rather than accepted-then-closed: a client sees 503 during the
            # handshake and retries, with no half-open session to clean up.
            return _json(connection, http.HTTPStatus.SERVICE_UNAVAILABLE, health.to_dict())
        return None

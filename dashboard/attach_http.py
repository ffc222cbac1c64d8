"""The attach server's HTTP routes, read by the dashboard: the wire doctor and the locator.

``kvscope attach`` keeps each pod's last raw batches in memory only (they are not recorded),
so the Attached view's wire doctor asks the running server (``GET /wire?pod=NAME``, same host
and port as the websocket, the same token); live, the prompt box asks its ``POST /locate``,
which answers from the attach's whole history. Nothing is computed here.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from engine import envs

TIMEOUT_S = 3.0


def http_base(ws_url: str) -> str:
    u = urllib.parse.urlsplit(ws_url)
    return f"{'https' if u.scheme == 'wss' else 'http'}://{u.netloc}"


def get_json(ws_url: str, path: str, **params: str) -> dict[str, Any]:
    """GET ``path`` on the server behind ``ws_url``; ``{"error": ...}`` when it cannot be read."""
    return _call(ws_url, path, params, None)


def post_json(ws_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON to ``path``; the answer, or ``{"error": ...}``."""
    return _call(ws_url, path, {}, json.dumps(body).encode())


def _call(ws_url: str, path: str, params: dict[str, str], data: bytes | None) -> dict[str, Any]:
    token = envs.TOKEN.get()
    if token:
        params["token"] = token
    url = http_base(ws_url) + path + ("?" + urllib.parse.urlencode(params) if params else "")
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return {"error": json.loads(exc.read()).get("detail") or str(exc)}
        except ValueError:
            return {"error": str(exc)}
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}

"""The attach server's HTTP routes, read by the dashboard: the wire doctor's raw batches.

``kvscope attach`` keeps each pod's last raw batches in memory only (they are not recorded),
so the Attached view's wire doctor asks the running server (``GET /wire?pod=NAME``, same host
and port as the websocket, the same token). Only reads: nothing is computed here.
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
    token = envs.TOKEN.get()
    if token:
        params["token"] = token
    url = http_base(ws_url) + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return {"error": json.loads(exc.read()).get("detail") or str(exc)}
        except ValueError:
            return {"error": str(exc)}
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}

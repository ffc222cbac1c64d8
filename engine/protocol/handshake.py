"""How a client opens a connection (protocol v2), before any frame.

- A websocket on ``/`` (or ``/ws``) of the serve port. Text frames only; no
  compression.
- When the server has a token (``KVSCOPE_TOKEN``), present it as
  ``Authorization: Bearer <token>`` or ``?token=<token>``; otherwise HTTP 401.
- While the model loads (or after it failed to load), the handshake is refused
  with HTTP 503 and the ``/healthz`` JSON: retry later.
- Browser pages from other origins are refused (403); the dashboard's are not.
- Once open: ``hello``, then ``snapshot``, then ``step`` messages as the engine
  steps (see ``engine.protocol``).
"""

from __future__ import annotations


def auth_headers(token: str | None) -> dict[str, str] | None:
    """The handshake headers that present ``token`` (None: no token)."""
    return {"Authorization": f"Bearer {token}"} if token else None

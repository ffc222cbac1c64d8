"""Clients of ``kvscope serve``, on the typed protocol (``engine.protocol``).

No torch and no model anywhere in this package: the dashboard imports it.

- ``connect``: opening the websocket (token, retry while loading), ``ServerError``, and
  ``ClientOps``, the ops both clients send (submit, abort, restart, steps_since ...).
- ``client``: ``KVScopeClient``, synchronous request/response (scripts, ``kvscope submit``).
- ``live_state``: ``LiveState``, the pure fold of server messages into a live view.
- ``live``: ``LiveConnection``, a background thread keeping a ``LiveState`` (the dashboard).
- ``commands``: ``kvscope submit``.
"""

from engine.client.client import KVScopeClient
from engine.client.connect import DEFAULT_URL, ServerError
from engine.client.live import LiveConnection
from engine.client.live_state import LinkStatus, LiveView, SubmittedRequest

__all__ = ["DEFAULT_URL", "KVScopeClient", "LinkStatus", "LiveConnection", "LiveView",
           "ServerError", "SubmittedRequest"]

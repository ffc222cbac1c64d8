"""Opening a websocket to ``kvscope serve`` (see ``engine.protocol.handshake``), and
the one exception the clients raise.

No torch, no model: the dashboard imports this.
"""

from __future__ import annotations

import inspect
import time
import uuid
from typing import Any

from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from engine.core.sampling_params import SamplingParams
from engine.protocol.errors import ProtocolError
from engine.protocol.handshake import auth_headers
from engine.protocol.messages import Error
from engine.protocol.ops import Submit, sampling_params

DEFAULT_URL = "ws://127.0.0.1:8765"
CLIENT_MAX_SIZE = 256 << 20  # snapshots of big pools are large; the server is trusted here


class ServerError(ProtocolError):
    """A refusal: the server's ``error{code, message}`` reply; an op the protocol refuses
    before it is sent (the code the server would send); or a connection failure
    (``loading``, ``unauthorized``, ``http_<status>``, ``closed``, ``disconnected``)."""

    def __init__(self, code: str, message: str, request_id: str | None = None,
                 op: str | None = None) -> None:
        super().__init__(code, message, request_id, op)
        self.args = (f"{code}: {message}",)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    @classmethod
    def of(cls, err: Error | ProtocolError) -> ServerError:
        return cls(err.code, err.message, err.request_id, err.op)


def submit_op(prompt: str | list[int] | None = None, messages: list[dict] | None = None,
              params: SamplingParams | dict[str, Any] | None = None,
              request_id: str | None = None) -> Submit:
    """The ``submit`` op (a request id is made up when none is given); ServerError when
    the protocol refuses it (bad params, no prompt ...)."""
    rid = request_id or f"r-{uuid.uuid4().hex[:12]}"
    try:
        return Submit(prompt, messages, sampling_params(params, rid), rid)
    except ProtocolError as exc:
        raise ServerError.of(exc) from None


_CONNECT_PARAMS = inspect.signature(connect).parameters


def ws_connect(url: str, **kwargs: Any) -> ClientConnection:
    """websockets' sync ``connect``, returning the connection directly, without
    environment proxies (the server is local), across websockets versions."""
    if "legacy" in _CONNECT_PARAMS:  # websockets >= 17 warns unless asked for this
        kwargs.setdefault("legacy", True)
    if "proxy" in _CONNECT_PARAMS:
        kwargs.setdefault("proxy", None)
    return connect(url, **kwargs)


def open_connection(url: str, token: str | None, timeout: float, wait: float = 0.0) -> ClientConnection:
    """Open a websocket to the server; while it loads (503) or is not up yet
    (connection refused) retry for up to ``wait`` seconds. Raises ServerError
    for a refusal (``loading``, ``unauthorized``, ``http_<status>``)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            # close_timeout: with an unread backlog the reader is paused and would
            # never see the server's close frame; do not hang 10 s on close().
            return ws_connect(url, additional_headers=auth_headers(token), open_timeout=timeout,
                              compression=None, max_size=CLIENT_MAX_SIZE, close_timeout=2)
        except InvalidStatus as exc:
            status, body = exc.response.status_code, exc.response.body or b""
            if status == 503 and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            code = {503: "loading", 401: "unauthorized"}.get(status, f"http_{status}")
            raise ServerError(code, body.decode(errors="replace").strip() or str(exc)) from None
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise

"""What both clients of ``kvscope serve`` share: opening the websocket (see
``engine.protocol.handshake``), the one exception they raise, and ``ClientOps``, the
ops written once for ``KVScopeClient`` (one thread, reads its replies itself) and
``LiveConnection`` (a reader thread hands replies over). Each provides ``_send(op)``
and ``_call(op, timeout)``: send ``op`` and return the message whose ``reply_key`` is
the op's ``call_key``, raising ServerError when that reply is an ``error``.

No torch, no model: the dashboard imports this.
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import MutableSequence
from typing import Any

from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from engine.events.schema.step import StepRecord
from engine.protocol.codec import decode_message
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.handshake import auth_headers
from engine.protocol.messages import Accepted, Error, Message, Ok, Pong, Snapshot, Steps
from engine.protocol.ops import (
    Abort, AbortAll, Op, Ping, ResetPrefixCache, Restart, StepsSince, Submit, TakeSnapshot,
    sampling_params,
)

DEFAULT_URL = "ws://127.0.0.1:8765"
CLIENT_MAX_SIZE = 256 << 20  # snapshots of big pools are large; the server is trusted here


class ServerError(ProtocolError):
    """A refusal: the server's ``error{code, message}`` reply; an op the protocol refuses
    before it is sent (the code the server would send); or a connection failure
    (``loading``, ``unauthorized``, ``http_<status>``, ``closed``, ``disconnected``)."""

    def __init__(self, code: str, message: str, request_id: str | None = None,
                 op: str | None = None) -> None:
        super().__init__(code, message, request_id, op)
        self.args = (f"{code}: {message}",)  # str(exc) and repr(exc) show the code

    @classmethod
    def of(cls, err: Error | ProtocolError) -> ServerError:
        return cls(err.code, err.message, err.request_id, err.op)


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


def decode_frame(raw: str | bytes, errors: MutableSequence[Error]) -> Message | None:
    """A server frame as its message, or None for one that is not (filed in ``errors``)."""
    try:
        return decode_message(raw)
    except ProtocolError as exc:
        errors.append(Error(ErrorCode.BAD_JSON, f"undecodable server frame: {exc.message}"))
        return None


def call_key(op: Op) -> str:
    """What the reply to ``op`` is filed under: the request id of a submit, else ``op:<op>``."""
    return op.request_id if isinstance(op, Submit) else f"op:{op.type}"


_ANSWERS = {Steps: StepsSince.type, Pong: Ping.type, Snapshot: TakeSnapshot.type}


def reply_key(msg: Message) -> str | None:
    """Which call a message answers (the ``call_key`` it matches), or None."""
    if isinstance(msg, (Accepted, Error)) and msg.request_id is not None:
        return msg.request_id
    if isinstance(msg, (Ok, Error)) and msg.op:
        return f"op:{msg.op}"
    op = _ANSWERS.get(type(msg))
    return None if op is None else f"op:{op}"


class ClientOps(ABC):
    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url, self.token, self.timeout = url, token, timeout
        self._steps_lock = threading.Lock()  # one steps_since at a time (its replies share a key)

    @abstractmethod
    def _send(self, op: Op) -> None: ...

    @abstractmethod
    def _call(self, op: Op, timeout: float | None = None) -> Any: ...

    def submit(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
               params: Any = None, request_id: str | None = None,
               timeout: float | None = None) -> str:
        """Queue a request (an id is made up when none is given); returns its id once the
        server accepted it. ServerError if the protocol or the server refuses it."""
        rid = request_id or f"r-{uuid.uuid4().hex[:12]}"
        try:
            op = Submit(prompt, messages, sampling_params(params, rid), rid)
        except ProtocolError as exc:
            raise ServerError.of(exc) from None
        self._call(op, timeout)
        return rid

    def abort(self, request_id: str) -> None:
        """Ask to abort one of this connection's requests (it finishes with reason abort)."""
        self._send(Abort(request_id))

    def abort_all(self, timeout: float | None = None) -> Ok:
        """Abort every live request on the engine, any connection's; ``ok`` says how many."""
        return self._call(AbortAll(), timeout)

    def reset_prefix_cache(self, timeout: float | None = None) -> Ok:
        return self._call(ResetPrefixCache(), timeout)

    def restart(self, engine_options: dict[str, Any], timeout: float | None = None) -> Ok:
        """Rebuild the engine with new pool/scheduler options (a new run); returns the ``ok``."""
        try:
            op = Restart(dict(engine_options))
        except ProtocolError as exc:
            raise ServerError.of(exc) from None
        return self._call(op, timeout)

    def steps_since(self, seq: int, run_id: str | None = None, until: int | None = None,
                    timeout: float | None = None) -> list[StepRecord]:
        """The steps after ``seq`` of ``run_id`` (default: the live run) the server still
        has, from its buffer or its recording, asking again while it says ``more``
        (and no step at or past ``until`` arrived yet)."""
        out: list[StepRecord] = []
        with self._steps_lock:
            while True:
                reply: Steps = self._call(StepsSince(seq, run_id), timeout)
                out.extend(reply.steps)
                if not (reply.more and reply.steps) or (until is not None and out[-1].seq >= until):
                    return out
                seq, run_id = reply.steps[-1].seq, reply.run_id

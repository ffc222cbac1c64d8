"""KVScopeClient: a synchronous client of ``kvscope serve`` (websockets.sync).

No torch, no model: the dashboard and scripts import this. One thread at a time;
for a connection that follows the live engine in the background, use
``engine.server.live.LiveConnection`` (also importable from here).

    with KVScopeClient("ws://127.0.0.1:8765") as c:
        fin = c.generate("The capital of France is", params={"max_tokens": 8, "temperature": 0})
        print(fin["outputs"][0]["text"], fin["metrics"]["num_cached_tokens"])

Messages that arrive while the client waits for something else are kept:
steps (``drain_steps()``), outputs of other requests (``stream(rid)`` replays
them), hello/snapshot of a restart (``.hello``, ``.latest_snapshot``).
"""

from __future__ import annotations

import inspect
import json
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

DEFAULT_URL = "ws://127.0.0.1:8765"
CLIENT_MAX_SIZE = 256 << 20  # snapshots of big pools are large; the server is trusted here


class ServerError(Exception):
    """The server answered with ``error{code, message}`` (or refused the connection)."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.request_id = code, message, request_id


def _params_dict(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if hasattr(params, "to_dict"):  # an engine SamplingParams
        return params.to_dict()
    return dict(params)


def submit_op(prompt: Any = None, messages: Any = None, params: Any = None,
              request_id: str | None = None) -> dict[str, Any]:
    """The ``submit`` frame (a request id is made up when none is given)."""
    op: dict[str, Any] = {"type": "submit", "request_id": request_id or f"r-{uuid.uuid4().hex[:12]}",
                          "params": _params_dict(params)}
    if messages is not None:
        op["messages"] = messages
    else:
        op["prompt"] = prompt
    return op


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
    headers = {"Authorization": f"Bearer {token}"} if token else None
    while True:
        try:
            # close_timeout: with an unread backlog the reader is paused and would
            # never see the server's close frame; do not hang 10 s on close().
            return ws_connect(url, additional_headers=headers, open_timeout=timeout,
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


class KVScopeClient:
    """Blocking request/response client; not thread-safe (one thread at a time)."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 60.0,
                 max_buffered_steps: int = 10_000) -> None:
        self.url, self.token, self.timeout = url, token, timeout
        self.hello: dict[str, Any] | None = None
        self.run_id: str | None = None
        self.config: dict[str, Any] | None = None
        self.initial_snapshot: dict[str, Any] | None = None
        self.latest_snapshot: dict[str, Any] | None = None
        self.errors: list[dict[str, Any]] = []  # errors that name no request
        self._ws: ClientConnection | None = None
        # Bounded: a caller that never drains must not grow memory forever.
        self._steps: deque[dict[str, Any]] = deque(maxlen=max_buffered_steps)
        self._by_request: dict[str, deque[dict[str, Any]]] = {}

    # ---- connection ----------------------------------------------------------------------

    def connect(self, wait: float = 0.0) -> dict[str, Any]:
        """Connect, read ``hello`` and the first ``snapshot``; returns hello.
        ``wait``: seconds to keep retrying while the server starts or loads."""
        self._ws = open_connection(self.url, self.token, self.timeout, wait)
        self._wait(lambda m: m["type"] == "hello")
        self.initial_snapshot = self._wait(lambda m: m["type"] == "snapshot")
        return self.hello

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def __enter__(self) -> KVScopeClient:
        if self._ws is None:
            self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- ops ---------------------------------------------------------------------------------

    def submit(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
               params: Any = None, request_id: str | None = None) -> str:
        """Queue a request; returns its id once accepted. Raises ServerError."""
        op = submit_op(prompt, messages, params, request_id)
        rid = op["request_id"]
        self._send(op)
        self._wait(lambda m: m.get("request_id") == rid and m["type"] in ("accepted", "error"),
                   request_id=rid)
        return rid

    def stream(self, request_id: str) -> Iterator[dict[str, Any]]:
        """Yield the request's ``output`` messages, then its ``finished`` message."""
        want = ("output", "finished", "error")
        while True:
            q = self._by_request.get(request_id)
            if q:
                msg = q.popleft()
            else:
                msg = self._wait(lambda m: m.get("request_id") == request_id and m["type"] in want,
                                 request_id=request_id)
            if msg["type"] == "error":
                raise ServerError(msg["code"], msg["message"], request_id)
            yield msg
            if msg["type"] == "finished":
                self._by_request.pop(request_id, None)
                return

    def generate(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
                 params: Any = None, request_id: str | None = None) -> dict[str, Any]:
        """Submit and wait; returns the ``finished`` message."""
        rid = self.submit(prompt, messages, params, request_id)
        last: dict[str, Any] = {}
        for last in self.stream(rid):
            pass
        return last

    def abort(self, request_id: str) -> None:
        """Ask to abort one of this connection's requests (its stream ends with reason abort)."""
        self._send({"type": "abort", "request_id": request_id})

    def snapshot(self) -> dict[str, Any]:
        """A fresh ``snapshot{seq, state, metrics}`` message."""
        self._send({"type": "snapshot"})
        return self._wait(lambda m: m["type"] == "snapshot", op="snapshot")

    def reset_prefix_cache(self) -> dict[str, Any]:
        self._send({"type": "reset_prefix_cache"})
        return self._wait(lambda m: m["type"] == "ok" and m.get("op") == "reset_prefix_cache",
                          op="reset_prefix_cache")

    def ping(self) -> float:
        """Round-trip time in seconds."""
        t0 = time.monotonic()
        self._send({"type": "ping"})
        self._wait(lambda m: m["type"] == "pong", op="ping")
        return time.monotonic() - t0

    def restart(self, engine_options: dict[str, Any]) -> dict[str, Any]:
        """Rebuild the engine with new pool/scheduler options (a new run); returns the new hello."""
        self._send({"type": "restart", "engine": dict(engine_options)})
        self._wait(lambda m: m["type"] == "ok" and m.get("op") == "restart", op="restart")
        return self.hello

    def drain_steps(self) -> list[dict[str, Any]]:
        """Step messages received so far (oldest first), and forget them."""
        out = list(self._steps)
        self._steps.clear()
        return out

    def poll(self, timeout: float = 0.0) -> int:
        """Read whatever arrives within ``timeout`` into the buffers; returns how many."""
        n, deadline = 0, time.monotonic() + timeout
        while True:
            try:
                raw = self._conn().recv(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return n
            self._keep(json.loads(raw))
            n += 1

    # ---- plumbing -----------------------------------------------------------------------------

    def _conn(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("not connected: call connect() first")
        return self._ws

    def _send(self, op: dict[str, Any]) -> None:
        self._conn().send(json.dumps(op))

    def _wait(self, match: Callable[[dict[str, Any]], bool], op: str | None = None,
              request_id: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = json.loads(self._conn().recv(timeout=max(0.0, left)))
            except TimeoutError:
                raise TimeoutError(f"no reply from {self.url} within {self.timeout}s") from None
            except ConnectionClosed as exc:
                raise ServerError("closed", f"the server closed the connection ({exc})") from None
            is_error = msg.get("type") == "error"
            if match(msg) or (is_error and (
                    (op is not None and msg.get("op") == op)
                    or (request_id is not None and msg.get("request_id") == request_id))):
                if is_error:  # the reply we waited for is a refusal
                    raise ServerError(msg["code"], msg["message"], msg.get("request_id"))
                self._keep_state(msg)
                return msg
            self._keep(msg)

    def _keep_state(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "hello":
            self.hello, self.run_id, self.config = msg, msg.get("run_id"), msg.get("config")
        elif msg["type"] == "snapshot":
            self.latest_snapshot = msg

    def _keep(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "step":
            self._steps.append(msg)
        elif kind in ("hello", "snapshot"):
            self._keep_state(msg)
        elif msg.get("request_id") is not None and kind in ("output", "finished", "error", "accepted"):
            if kind != "accepted":
                self._by_request.setdefault(msg["request_id"], deque()).append(msg)
        elif kind == "error":
            self.errors.append(msg)


def __getattr__(name: str) -> Any:
    # LiveConnection lives in its own module (one concept per file) but is
    # reachable from here, where the dashboard looks for clients.
    if name in ("LiveConnection", "BackgroundClient", "LiveView", "LinkStatus", "RequestProgress"):
        from engine.server import live

        return getattr(live, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

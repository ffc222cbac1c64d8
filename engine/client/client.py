"""KVScopeClient: a synchronous client of ``kvscope serve`` (websockets.sync).

No torch, no model: the dashboard and scripts import this. One thread at a time;
for a connection that follows the live engine in the background, use
``engine.client.live.LiveConnection``. Ops go out and messages come back as the
protocol's types (``engine.protocol``).

    with KVScopeClient("ws://127.0.0.1:8765") as c:
        fin = c.generate("The capital of France is", params={"max_tokens": 8, "temperature": 0})
        print(fin.outputs[0]["text"], fin.metrics["num_cached_tokens"])

Messages that arrive while the client waits for something else are kept:
steps (``drain_steps()``), outputs of other requests (``stream(rid)`` replays
them), hello/snapshot of a restart (``.hello``, ``.latest_snapshot``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from engine.client.connect import (
    DEFAULT_URL, ClientOps, ServerError, call_key, decode_frame, open_connection, reply_key,
)
from engine.events.schema.step import StepRecord
from engine.protocol.codec import encode
from engine.protocol.messages import Error, Finished, Hello, Message, Output, Snapshot, Step
from engine.protocol.ops import Op, Ping, TakeSnapshot


class KVScopeClient(ClientOps):
    """Blocking request/response client; not thread-safe (one thread at a time)."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 60.0,
                 max_buffered_steps: int = 10_000) -> None:
        super().__init__(url, token, timeout)
        self.hello: Hello | None = None
        self.initial_snapshot: Snapshot | None = None
        self.latest_snapshot: Snapshot | None = None
        self.errors: list[Error] = []  # errors that name no request, and undecodable frames
        self._ws: ClientConnection | None = None
        # Bounded: a caller that never drains must not grow memory forever.
        self._steps: deque[StepRecord] = deque(maxlen=max_buffered_steps)
        self._by_request: dict[str, deque[Message]] = {}

    @property
    def run_id(self) -> str | None:
        return None if self.hello is None else self.hello.run_id

    @property
    def config(self) -> dict[str, Any] | None:
        return None if self.hello is None else self.hello.config

    # ---- connection ----------------------------------------------------------------------

    def connect(self, wait: float = 0.0) -> Hello:
        """Connect, read ``hello`` and the first ``snapshot``; returns hello.
        ``wait``: seconds to keep retrying while the server starts or loads."""
        self._ws = open_connection(self.url, self.token, self.timeout, wait)
        self._wait(lambda m: isinstance(m, Hello))
        self.initial_snapshot = self._wait(lambda m: isinstance(m, Snapshot))
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

    # ---- ops (submit, abort, abort_all, reset_prefix_cache, steps_since: ClientOps) -----------

    def stream(self, request_id: str) -> Iterator[Output | Finished]:
        """Yield the request's ``output`` messages, then its ``finished`` message."""
        while True:
            q = self._by_request.get(request_id)
            if q:
                msg = q.popleft()
            else:
                msg = self._wait(lambda m: isinstance(m, (Output, Finished, Error))
                                 and m.request_id == request_id)
            if isinstance(msg, Error):
                raise ServerError.of(msg)
            yield msg
            if isinstance(msg, Finished):
                self._by_request.pop(request_id, None)
                return

    def generate(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
                 params: Any = None, request_id: str | None = None) -> Finished:
        """Submit and wait; returns the ``finished`` message."""
        rid = self.submit(prompt, messages, params, request_id)
        last = None
        for last in self.stream(rid):
            pass
        return last

    def snapshot(self) -> Snapshot:
        """A fresh snapshot of the pool."""
        return self._call(TakeSnapshot())

    def ping(self) -> float:
        """Round-trip time in seconds."""
        t0 = time.monotonic()
        self._call(Ping())
        return time.monotonic() - t0

    def restart(self, engine_options: dict[str, Any], timeout: float | None = None) -> Hello:
        """Rebuild the engine with new pool/scheduler options (a new run); returns the new
        hello (it arrives before the ``ok``)."""
        super().restart(engine_options, timeout)
        return self.hello

    def drain_steps(self) -> list[StepRecord]:
        """Steps received so far (oldest first), and forget them."""
        out = list(self._steps)
        self._steps.clear()
        return out

    def poll(self, timeout: float = 0.0) -> int:
        """Read whatever arrives within ``timeout`` into the buffers; returns how many."""
        n, deadline = 0, time.monotonic() + timeout
        while True:
            try:
                msg = self._recv(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return n
            if msg is not None:
                self._keep(msg)
            n += 1

    # ---- plumbing -----------------------------------------------------------------------------

    def _conn(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("not connected: call connect() first")
        return self._ws

    def _send(self, op: Op) -> None:
        self._conn().send(encode(op))

    def _recv(self, timeout: float) -> Message | None:
        """The next message (None for a frame that is not one, kept in ``errors``)."""
        return decode_frame(self._conn().recv(timeout=timeout), self.errors)

    def _call(self, op: Op, timeout: float | None = None) -> Any:
        self._send(op)
        key = call_key(op)
        return self._wait(lambda m: reply_key(m) == key, timeout)

    def _wait(self, match: Callable[[Message], bool], timeout: float | None = None) -> Any:
        """The first message ``match`` takes (ServerError if it is an ``error``); the
        others that arrive meanwhile are kept."""
        timeout = timeout or self.timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self._recv(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise TimeoutError(f"no reply from {self.url} within {timeout}s") from None
            except ConnectionClosed as exc:
                raise ServerError("closed", f"the server closed the connection ({exc})") from None
            if msg is None:
                continue
            if match(msg):
                if isinstance(msg, Error):  # the reply we waited for is a refusal
                    raise ServerError.of(msg)
                if isinstance(msg, (Hello, Snapshot)):
                    self._keep(msg)
                return msg
            self._keep(msg)

    def _keep(self, msg: Message) -> None:
        if isinstance(msg, Step):
            self._steps.append(msg.record)
        elif isinstance(msg, Hello):
            self.hello = msg
        elif isinstance(msg, Snapshot):
            self.latest_snapshot = msg
        elif isinstance(msg, (Output, Finished, Error)) and msg.request_id is not None:
            self._by_request.setdefault(msg.request_id, deque()).append(msg)
        elif isinstance(msg, Error):
            self.errors.append(msg)

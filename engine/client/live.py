"""LiveConnection: follow a live server from a background thread (the dashboard's view).

A daemon thread connects (retrying while the server starts or loads, and after
it goes away), receives everything and folds it into a ``LiveState`` (pool
state from snapshot + step events, bounded metrics history and recent steps,
outputs of this client's requests). On a ``seq`` gap it asks for a snapshot.

Any thread may call ``view()`` (a consistent copy), ``submit()`` (returns once
the server accepted), ``outputs()``, ``abort()``, ``abort_all()``, ``reset_prefix_cache()``,
``request_snapshot()``, ``steps_since()``, ``restart()``, ``stop()``. No torch
imports.

Writer: the reader thread folds messages under ``_lock``; callers read copies
under it and send frames under ``_send_lock``.
"""

from __future__ import annotations

import threading
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from engine.client.connect import (
    DEFAULT_URL, ClientOps, ServerError, call_key, decode_frame, open_connection, reply_key,
)
from engine.client.live_state import LinkStatus, LiveState, LiveView, SubmittedRequest
from engine.protocol.codec import encode
from engine.protocol.messages import Error, Message
from engine.protocol.ops import Op, Submit, TakeSnapshot

class LiveConnection(ClientOps):
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, history: int = 600,
                 recent_steps: int = 100, max_requests: int = 1000, retry_s: float = 0.5,
                 timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every message
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._ws: ClientConnection | None = None
        self._live = LiveState(history, recent_steps, max_requests)
        self._awaiting: set[str] = set()  # reply keys a caller waits for
        self._replies: dict[str, Message] = {}  # by request id, or "op:<op>"
        self._thread = threading.Thread(target=self._run, name="kvscope-live", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LiveConnection:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)
        with self._lock:
            self._live.status = LinkStatus.STOPPED

    def __enter__(self) -> LiveConnection:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_live(self, timeout: float = 30.0) -> bool:
        """Block until connected with a folded state (True) or ``timeout`` (False)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._live.status is LinkStatus.LIVE and self._live.state is not None, timeout)

    # ---- reading ------------------------------------------------------------------------------

    def view(self) -> LiveView:
        with self._lock:
            view = self._live.view()
            ask = self._live.wants_snapshot()  # e.g. a drift found while copying the state
        if ask:
            self._try_send(TakeSnapshot())
        return view

    def outputs(self, request_id: str) -> SubmittedRequest | None:
        """A copy of what arrived for one of this connection's requests."""
        with self._lock:
            p = self._live.requests.get(request_id)
            return None if p is None else p.copy()

    # ---- ops -----------------------------------------------------------------------------------

    def request_snapshot(self) -> None:
        self._send(TakeSnapshot())

    def _call(self, op: Op, timeout: float | None = None) -> Any:
        """Send ``op`` and wait for the reader thread to hand over its reply; a submitted
        request's outputs then collect in the background (``outputs(request_id)``)."""
        key = call_key(op)
        with self._lock:
            self._awaiting.add(key)
            if isinstance(op, Submit):
                self._live.track(op.request_id)
        try:
            self._send(op)
            with self._changed:
                if not self._changed.wait_for(lambda: key in self._replies, timeout or self.timeout):
                    raise TimeoutError(f"no reply to {op.type} from {self.url}")
                reply = self._replies.pop(key)
        finally:
            with self._lock:
                self._awaiting.discard(key)
        if isinstance(reply, Error):
            raise ServerError.of(reply)
        return reply

    def _send(self, op: Op) -> None:
        with self._send_lock:
            if self._ws is None:
                raise ServerError("disconnected", f"not connected to {self.url} ({self._live.status.value})")
            try:
                self._ws.send(encode(op))
            except ConnectionClosed as exc:
                raise ServerError("disconnected", str(exc)) from None

    def _try_send(self, op: Op) -> None:
        try:
            self._send(op)
        except ServerError:
            pass  # the reader will notice the close and reconnect

    # ---- reader thread -------------------------------------------------------------------------

    def _set_status(self, status: LinkStatus, error: str | None = None) -> None:
        with self._changed:
            self._live.status = status
            if error:
                self._live.errors.append(Error("connection", error))
            self._changed.notify_all()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                ws = open_connection(self.url, self.token, self.timeout)
            except ServerError as exc:
                loading = exc.code == "loading"
                self._set_status(LinkStatus.LOADING if loading else LinkStatus.DISCONNECTED,
                                 None if loading else str(exc))
            except Exception as exc:  # refused, reset, bad handshake: keep trying
                self._set_status(LinkStatus.CONNECTING if self._live.hello is None
                                 else LinkStatus.DISCONNECTED, f"{type(exc).__name__}: {exc}")
            else:
                with self._send_lock:
                    self._ws = ws
                try:
                    self._receive(ws)
                except ConnectionClosed as exc:
                    self._set_status(LinkStatus.DISCONNECTED, f"connection closed: {exc}")
                finally:
                    with self._send_lock:
                        self._ws = None
                    ws.close()
            self._stopping.wait(self.retry_s)

    def _receive(self, ws: ClientConnection) -> None:
        while not self._stopping.is_set():
            try:
                raw = ws.recv(timeout=0.25)  # wake regularly to notice stop()
            except TimeoutError:
                continue
            with self._changed:
                msg = decode_frame(raw, self._live.errors)
                if msg is None:  # not a message: noted, the state is intact
                    continue
                try:
                    ask = self._live.apply(msg)
                except Exception as exc:  # a message that does not fold must not kill the view
                    self._live.drift(f"could not apply a message: {type(exc).__name__}: {exc}")
                    ask = self._live.wants_snapshot()
                key = reply_key(msg)
                if key in self._awaiting:
                    self._replies[key] = msg
                self._changed.notify_all()
            if ask:
                self._try_send(TakeSnapshot())

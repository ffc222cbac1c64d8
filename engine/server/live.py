"""LiveConnection: follow a live server from a background thread (the dashboard's view).

A daemon thread connects (retrying while the server starts or loads, and after
it goes away), receives everything and folds it into a ``LiveState`` (pool
state from snapshot + step events, bounded metrics history and recent steps,
outputs of this client's requests). On a ``seq`` gap it asks for a snapshot.

Any thread may call ``view()`` (a consistent copy), ``submit()`` (returns once
the server accepted), ``outputs()``, ``abort()``, ``reset_prefix_cache()``,
``request_snapshot()``, ``restart()``, ``stop()``. No torch imports.

Writer: the reader thread folds messages under ``_lock``; callers read copies
under it and send frames under ``_send_lock``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from engine.server.client import DEFAULT_URL, ServerError, open_connection, submit_op
from engine.server.live_state import LinkStatus, LiveState, LiveView, RequestProgress

__all__ = ["BackgroundClient", "LinkStatus", "LiveConnection", "LiveView", "RequestProgress"]


class LiveConnection:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, history: int = 600,
                 recent_steps: int = 100, max_requests: int = 1000, retry_s: float = 0.5,
                 timeout: float = 30.0) -> None:
        self.url, self.token, self.timeout, self.retry_s = url, token, timeout, retry_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every message
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._ws: ClientConnection | None = None
        self._live = LiveState(history, recent_steps, max_requests)
        self._awaiting: set[str] = set()  # reply keys a caller waits for
        self._replies: dict[str, dict[str, Any]] = {}  # by request id, or "op:<op>" for ok
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
            self._try_send({"type": "snapshot"})
        return view

    def outputs(self, request_id: str) -> RequestProgress | None:
        """A copy of what arrived for one of this connection's requests."""
        with self._lock:
            p = self._live.requests.get(request_id)
            return None if p is None else p.copy()

    # ---- ops -----------------------------------------------------------------------------------

    def submit(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
               params: Any = None, request_id: str | None = None,
               timeout: float | None = None) -> str:
        """Send a request; returns its id once the server accepted it (ServerError if not).
        Outputs then collect in the background: see ``outputs(request_id)``."""
        op = submit_op(prompt, messages, params, request_id)
        with self._lock:
            self._live.track(op["request_id"])
        self._call(op["request_id"], op, timeout)
        return op["request_id"]

    def abort(self, request_id: str) -> None:
        self._send({"type": "abort", "request_id": request_id})

    def request_snapshot(self) -> None:
        self._send({"type": "snapshot"})

    def reset_prefix_cache(self, timeout: float | None = None) -> dict[str, Any]:
        return self._call("op:reset_prefix_cache", {"type": "reset_prefix_cache"}, timeout)

    def restart(self, engine_options: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Restart the engine with new pool/scheduler options; returns the ``ok`` message."""
        return self._call("op:restart", {"type": "restart", "engine": dict(engine_options)}, timeout)

    def _call(self, key: str, op: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send ``op`` and wait for its reply (keyed by request id or ``op:<name>``)."""
        with self._lock:
            self._awaiting.add(key)
        try:
            self._send(op)
            with self._changed:
                if not self._changed.wait_for(lambda: key in self._replies, timeout or self.timeout):
                    raise TimeoutError(f"no reply to {op['type']} from {self.url}")
                reply = self._replies.pop(key)
        finally:
            with self._lock:
                self._awaiting.discard(key)
        if reply["type"] == "error":
            raise ServerError(reply["code"], reply["message"], reply.get("request_id"))
        return reply

    def _send(self, op: dict[str, Any]) -> None:
        with self._send_lock:
            if self._ws is None:
                raise ServerError("disconnected", f"not connected to {self.url} ({self._live.status.value})")
            try:
                self._ws.send(json.dumps(op))
            except ConnectionClosed as exc:
                raise ServerError("disconnected", str(exc)) from None

    def _try_send(self, op: dict[str, Any]) -> None:
        try:
            self._send(op)
        except ServerError:
            pass  # the reader will notice the close and reconnect

    # ---- reader thread -------------------------------------------------------------------------

    def _set_status(self, status: LinkStatus, error: str | None = None) -> None:
        with self._changed:
            self._live.status = status
            if error:
                self._live.errors.append({"type": "connection", "message": error, "ts": time.time()})
            self._changed.notify_all()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                ws = open_connection(self.url, self.token, self.timeout)
            except ServerError as exc:
                loading = exc.code == "loading"
                self._set_status(LinkStatus.LOADING if loading else LinkStatus.DISCONNECTED,
                                 None if loading else str(exc))
                self._stopping.wait(self.retry_s)
                continue
            except Exception as exc:  # refused, reset, bad handshake: keep trying
                self._set_status(LinkStatus.CONNECTING if self._live.hello is None
                                 else LinkStatus.DISCONNECTED, f"{type(exc).__name__}: {exc}")
                self._stopping.wait(self.retry_s)
                continue
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
                try:
                    msg = json.loads(raw)
                    ask = self._live.apply(msg)
                    self._route_reply(msg)
                except Exception as exc:  # a bad message must not kill the view: re-base
                    self._live.drift(f"could not apply a message: {type(exc).__name__}: {exc}")
                    ask = self._live.wants_snapshot()
                self._changed.notify_all()
            if ask:
                self._try_send({"type": "snapshot"})

    def _route_reply(self, msg: dict[str, Any]) -> None:  # holds _lock
        kind, rid, op = msg.get("type"), msg.get("request_id"), msg.get("op")
        key = rid if kind in ("accepted", "error") and rid is not None else (
            f"op:{op}" if kind in ("ok", "error") and op else None)
        if key in self._awaiting:
            self._replies[key] = msg


BackgroundClient = LiveConnection  # the name the issue also uses

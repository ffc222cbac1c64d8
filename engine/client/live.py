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

from engine.client.connect import DEFAULT_URL, ServerError, open_connection, submit_op
from engine.client.live_state import LinkNote, LinkStatus, LiveState, LiveView, SubmittedRequest
from engine.events.schema.step import StepRecord
from engine.protocol.codec import decode_message, encode
from engine.protocol.errors import ProtocolError
from engine.protocol.messages import Accepted, Error, Message, Ok, Steps
from engine.protocol.ops import (
    Abort, AbortAll, Op, ResetPrefixCache, Restart, StepsSince, TakeSnapshot,
)

__all__ = ["LinkStatus", "LiveConnection", "LiveView", "SubmittedRequest"]


def _reply_key(msg: Message) -> str | None:
    """Which caller a reply is for: a request id, or ``op:<op>``."""
    if isinstance(msg, (Accepted, Error)) and msg.request_id is not None:
        return msg.request_id
    if isinstance(msg, (Ok, Error)) and msg.op:
        return f"op:{msg.op}"
    if isinstance(msg, Steps):
        return f"op:{StepsSince.type}"
    return None


class LiveConnection:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, *, history: int = 600,
                 recent_steps: int = 100, max_requests: int = 1000, retry_s: float = 0.5,
                 timeout: float = 30.0) -> None:
        self.url, self.token, self.timeout, self.retry_s = url, token, timeout, retry_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified after every message
        self._send_lock = threading.Lock()
        self._steps_lock = threading.Lock()  # one steps_since at a time (one reply key)
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

    def submit(self, prompt: str | list[int] | None = None, messages: list[dict] | None = None,
               params: Any = None, request_id: str | None = None,
               timeout: float | None = None) -> str:
        """Send a request; returns its id once the server accepted it (ServerError if not).
        Outputs then collect in the background: see ``outputs(request_id)``."""
        op = submit_op(prompt, messages, params, request_id)
        with self._lock:
            self._live.track(op.request_id)
        self._call(op.request_id, op, timeout)
        return op.request_id

    def abort(self, request_id: str) -> None:
        self._send(Abort(request_id))

    def abort_all(self, timeout: float | None = None) -> Ok:
        """Abort every live request on the engine (any connection's); ``ok`` says how many."""
        return self._call(f"op:{AbortAll.type}", AbortAll(), timeout)

    def request_snapshot(self) -> None:
        self._send(TakeSnapshot())

    def reset_prefix_cache(self, timeout: float | None = None) -> Ok:
        return self._call(f"op:{ResetPrefixCache.type}", ResetPrefixCache(), timeout)

    def restart(self, engine_options: dict[str, Any], timeout: float | None = None) -> Ok:
        """Restart the engine with new pool/scheduler options; returns the ``ok`` message."""
        try:
            op = Restart(dict(engine_options))
        except ProtocolError as exc:
            raise ServerError.of(exc) from None
        return self._call(f"op:{Restart.type}", op, timeout)

    def steps_since(self, seq: int, run_id: str | None = None, until: int | None = None,
                    timeout: float | None = None) -> list[StepRecord]:
        """The steps after ``seq`` of ``run_id`` (default: the live run) the server still
        has, from its buffer or its recording, asking again while it says ``more``
        (and no step at or past ``until`` arrived yet)."""
        out: list[StepRecord] = []
        with self._steps_lock:
            while True:
                reply: Steps = self._call(f"op:{StepsSince.type}", StepsSince(seq, run_id), timeout)
                out.extend(reply.steps)
                if not (reply.more and reply.steps) or (until is not None and out[-1].seq >= until):
                    return out
                seq, run_id = reply.steps[-1].seq, reply.run_id

    def _call(self, key: str, op: Op, timeout: float | None) -> Any:
        """Send ``op`` and wait for its reply (keyed by request id or ``op:<name>``)."""
        with self._lock:
            self._awaiting.add(key)
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
                self._live.errors.append(LinkNote("connection", error))
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
                    msg = decode_message(raw)
                except ProtocolError as exc:  # not a message: note it, the state is intact
                    self._live.errors.append(LinkNote("bad_message", exc.message))
                    continue
                try:
                    ask = self._live.apply(msg)
                except Exception as exc:  # a message that does not fold must not kill the view
                    self._live.drift(f"could not apply a message: {type(exc).__name__}: {exc}")
                    ask = self._live.wants_snapshot()
                key = _reply_key(msg)
                if key in self._awaiting:
                    self._replies[key] = msg
                self._changed.notify_all()
            if ask:
                self._try_send(TakeSnapshot())

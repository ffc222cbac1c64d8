"""LiveState: what a live client knows of the server, folded from server messages.

Pure Python, no I/O and no locks (``LiveConnection`` adds the thread, the socket
and the lock). Step events fold into a ``PoolState`` (the reducer replay uses), or
a ``HashCacheState`` when the server is ``kvscope attach``, starting from the
server's snapshot; steps with ``seq`` at or below the
snapshot's are already in it. A gap in ``seq`` (the server dropped steps for a
slow client) or an event the reducer rejects (drift) puts it in ``resyncing``:
``apply`` then answers True once, meaning "ask the server for a snapshot", and
the next snapshot re-bases the state. A new ``hello`` with another run id (a
restart) clears the history.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from engine.events.folds.reducer import ImpossibleEventError
from engine.events.folds.run_kind import AnySnapshot, AnyState, state_from_snapshot
from engine.events.schema.step import StepRecord
from engine.protocol.messages import Error, Finished, Hello, Message, Output, Snapshot, Step


class LinkStatus(str, enum.Enum):
    """Where the connection stands (a str, so ``view.status == "live"`` works)."""

    CONNECTING = "connecting"  # never connected yet
    LOADING = "loading"  # the server answers 503: its model is loading
    LIVE = "live"  # folding steps onto a snapshot
    RESYNCING = "resyncing"  # missed steps or drifted; waiting for a snapshot
    DISCONNECTED = "disconnected"  # lost the server; retrying
    STOPPED = "stopped"  # stop() was called


@dataclass(frozen=True, slots=True)
class LiveView:
    """What the server looks like right now, as this connection knows it."""

    status: LinkStatus
    hello: Hello | None
    run_id: str | None
    config: dict[str, Any] | None
    seq: int  # last step folded into ``state``
    state: AnySnapshot | None  # the folded pool (or hash cache) as of ``seq`` (lags while resyncing)
    metrics: dict[str, Any] | None  # latest step's metrics
    metrics_history: list[dict[str, Any]]  # oldest first, bounded
    recent_steps: list[StepRecord]  # oldest first, bounded
    # recent error messages that name no request, and this client's own notes as errors:
    # ``resync`` (why), ``connection`` (a fault), ``bad_json`` (an undecodable frame)
    errors: list[Error]
    num_gaps: int  # times a seq gap forced a resync


@dataclass(slots=True)
class SubmittedRequest:
    """What arrived for one of this client's requests."""

    request_id: str
    texts: dict[int, str] = field(default_factory=dict)  # by sample index
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    finished: Finished | None = None
    error: Error | None = None

    def copy(self) -> SubmittedRequest:
        return SubmittedRequest(self.request_id, dict(self.texts),
                               {k: list(v) for k, v in self.token_ids.items()}, self.finished, self.error)


class LiveState:
    def __init__(self, history: int = 600, recent_steps: int = 100, max_requests: int = 1000) -> None:
        self.status = LinkStatus.CONNECTING
        self.hello: Hello | None = None
        self.state: AnyState | None = None  # None: waiting for a snapshot (or after a drift)
        self.seq = -1
        self.resyncing = False
        self._asked = False  # one snapshot request per resync
        self._last_good: AnySnapshot | None = None  # shown while the state is unusable
        self.metrics: dict[str, Any] | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=history)
        self.recent: deque[StepRecord] = deque(maxlen=recent_steps)
        self.errors: deque[Error] = deque(maxlen=50)
        self.gaps = 0
        self.max_requests = max_requests
        self.requests: OrderedDict[str, SubmittedRequest] = OrderedDict()

    # ---- reading ----------------------------------------------------------------------

    def view(self) -> LiveView:
        h = self.hello
        return LiveView(self.status, h, h.run_id if h else None, h.config if h else None,
                        self.seq, self._state_dict(), self.metrics, list(self.history),
                        list(self.recent), list(self.errors), self.gaps)

    def _state_dict(self) -> AnySnapshot | None:
        if self.state is not None:
            try:
                self._last_good = self.state.to_snapshot()
            except ImpossibleEventError as exc:
                self.drift(str(exc))
        return self._last_good

    def track(self, request_id: str) -> None:
        """Collect outputs for one of our requests (the oldest are forgotten past the bound)."""
        self.requests[request_id] = SubmittedRequest(request_id)
        while len(self.requests) > self.max_requests:
            self.requests.popitem(last=False)

    # ---- folding ------------------------------------------------------------------------

    def apply(self, msg: Message) -> bool:
        """Fold one server message; True when the caller should now request a snapshot."""
        if isinstance(msg, Hello):
            if self.hello is None or msg.run_id != self.hello.run_id:
                self.history.clear()
                self.recent.clear()
                self.metrics = None
            self.hello, self.state, self.seq, self._last_good = msg, None, -1, None
        elif isinstance(msg, Snapshot):
            self.state = state_from_snapshot(msg.state)
            self.seq = msg.seq
            self.resyncing = self._asked = False
            self.metrics = msg.metrics or self.metrics
            self.status = LinkStatus.LIVE
        elif isinstance(msg, Step):
            self._step(msg.record)
            return self.wants_snapshot()
        elif isinstance(msg, (Output, Finished, Error)) and msg.request_id in self.requests:
            p = self.requests[msg.request_id]
            if isinstance(msg, Output):
                p.texts[msg.index] = p.texts.get(msg.index, "") + msg.text_delta
                p.token_ids.setdefault(msg.index, []).extend(msg.token_ids)
            elif isinstance(msg, Finished):
                p.finished = msg
            else:
                p.error = msg
        elif isinstance(msg, Error):
            self.errors.append(msg)
        return False

    def _step(self, record: StepRecord) -> None:
        if record.seq <= self.seq:
            return  # already in our snapshot
        self.metrics = record.metrics
        self.history.append(self.metrics)
        self.recent.append(record)
        if self.state is None or self.resyncing:
            return
        if record.seq != self.seq + 1:
            self.gaps += 1
            self.resync(f"missed steps {self.seq + 1}..{record.seq - 1}")
            return
        try:
            self.state.apply_step(record)
            self.seq = record.seq
        except (ImpossibleEventError, KeyError, ValueError) as exc:
            self.drift(f"reducer drift at step {record.step}: {exc}")

    def wants_snapshot(self) -> bool:
        """True once per resync: the moment to ask the server for a snapshot."""
        if self.resyncing and not self._asked:
            self._asked = True
            return True
        return False

    def resync(self, why: str) -> None:
        """Stop folding until a snapshot arrives (the state stays valid as of ``seq``)."""
        self.resyncing, self._asked = True, False
        self.status = LinkStatus.RESYNCING
        self.errors.append(Error("resync", why))

    def drift(self, why: str) -> None:
        """Like ``resync``, but the state may be half-applied: drop it."""
        self.state = None
        self.resync(why)

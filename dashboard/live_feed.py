"""LiveFeed: turns the websocket client's view into RunFrames for the Live page.

``LiveConnection`` (engine.client.live) folds steps into the pool state on its own
thread but keeps only a bounded window of recent steps. The Live page also wants
the whole run (latency distributions, the contiguous baseline), so the feed keeps
every StepRecord of the current run, filling any gap (steps that scrolled out of
the client's window between two polls) by asking the server (``steps_since``:
its step buffer, or its recording for older steps). The dashboard never reads
the recording's tables itself.

Writer: ``poll`` (under ``_lock``); shared by all sessions via st.cache_resource.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.client import ServerError
from engine.events.hash_cache_snapshot import HashCacheSnapshot
from engine.events.step import StepRecord

from dashboard.attached_frame import AttachedFrame
from dashboard.frame import RunFrame
from dashboard.token_text import token_text_for

MAX_RECORDS = 50_000  # ~hours of steps; beyond, the oldest go (charts window anyway)

# (run_id, after_seq, until_seq) -> the run's steps after ``after_seq`` the server has;
# it may stop once it reached ``until_seq``. LiveConnection.steps_since in the app.
StepsSince = Callable[[str, int, int], list[StepRecord]]


class LiveFeed:
    """Accumulates the live run's steps; ``frame(view)`` builds what Live draws."""

    def __init__(self, steps_since: StepsSince | None = None) -> None:
        self._lock = threading.Lock()
        self._steps_since = steps_since
        self.run_id: str | None = None
        self.records: list[StepRecord] = []
        self.last_seq = -1
        self.max_tokens: dict[str, int | None] = {}  # params of requests sent from here
        self.missing_steps = 0  # steps lost for good (neither in the window nor on the server)

    def note_submission(self, request_id: str, params: dict[str, Any]) -> None:
        """Remember a request's max_tokens (the contiguous baseline reserves by it)."""
        with self._lock:
            self.max_tokens[request_id] = params.get("max_tokens")

    def poll(self, view: Any) -> list[StepRecord]:
        """Take the view's new steps (seq order); returns this run's records so far."""
        with self._lock:
            if view.run_id != self.run_id:
                self.run_id, self.records, self.last_seq = view.run_id, [], -1
            fresh = sorted((r for r in view.recent_steps if r.seq > self.last_seq),
                           key=lambda r: r.seq)
            if fresh and fresh[0].seq > self.last_seq + 1:
                self._fill_gap(fresh[0].seq)
            for r in fresh:
                self.records.append(r)
                self.last_seq = r.seq
            if len(self.records) > MAX_RECORDS:
                del self.records[:len(self.records) - MAX_RECORDS]
            return list(self.records)

    def _fill_gap(self, next_seq: int) -> None:
        """Fetch the steps between ``last_seq`` and ``next_seq`` from the server."""
        want = range(self.last_seq + 1, next_seq)
        got: list[StepRecord] = []
        if self.run_id is not None and self._steps_since is not None:
            try:
                got = [r for r in self._steps_since(self.run_id, self.last_seq, next_seq - 1)
                       if r.seq in want]
            except (ServerError, TimeoutError, OSError):
                got = []  # the server cannot say: those steps are lost for this view
        self.missing_steps += len(want) - len(got)
        self.records.extend(got)
        if got:
            self.last_seq = got[-1].seq

    def frame(self, view: Any, records: list[StepRecord]) -> RunFrame | AttachedFrame | None:
        """The frame for the view's folded state (None before the first snapshot): a
        RunFrame for an engine, an AttachedFrame for ``kvscope attach``."""
        if view.state is None:
            return None
        events = next((r.events for r in reversed(records) if r.seq == view.seq), [])
        if isinstance(view.state, HashCacheSnapshot):
            return AttachedFrame("live", view.run_id or "live", view.state, events, records,
                                 view.config or {}, token_text_for(view.config),
                                 metrics=view.metrics or {})
        history = [r.metrics for r in records]
        if not history and view.metrics:
            history = [view.metrics]
        return RunFrame(source="live", key=view.run_id or "live", snapshot=view.state,
                        events=events, history=history, config=view.config or {},
                        records=records, max_tokens=dict(self.max_tokens),
                        token_text=token_text_for(view.config))

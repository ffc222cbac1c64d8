"""LiveFeed: turns the websocket client's view into RunFrames for the Live page.

``LiveConnection`` (engine.client.live) folds steps into the pool state on its own
thread but keeps only a bounded window of recent steps. The Live page also wants
the whole run (latency distributions, the contiguous baseline), so the feed keeps
every StepRecord of the current run, filling any gap (steps that scrolled out of
the client's window between two polls) by asking the server (``steps_since``:
its step buffer, or its recording for older steps). The dashboard never reads
the recording's tables itself.

It also reads every record into a ``ScheduleTrace`` (the contiguous baseline's
input) as it arrives, so the baseline always ends at the shown step.

Writer: ``poll`` and ``frame`` (under ``_lock``); shared by all sessions via
st.cache_resource.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.client import ServerError
from engine.events.baseline.schedule_trace import ScheduleTrace
from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.schema.step import StepRecord

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
        self.schedule = ScheduleTrace(self.max_tokens)  # the contiguous baseline's input
        self.missing_steps = 0  # steps lost for good (neither in the window nor on the server)
        self.dropped_frames = 0  # polls whose parts were not of one step (not drawn)
        self._last_frame: RunFrame | None = None

    def note_submission(self, request_id: str, params: dict[str, Any]) -> None:
        """Remember a request's max_tokens (the contiguous baseline reserves by it)."""
        with self._lock:
            self.max_tokens[request_id] = params.get("max_tokens")

    def poll(self, view: Any) -> list[StepRecord]:
        """Take the view's new steps (seq order), filling gaps up to the view's folded
        step from the server; returns this run's records so far."""
        with self._lock:
            if view.run_id != self.run_id:
                self.run_id, self.records, self.last_seq = view.run_id, [], -1
                self.schedule = ScheduleTrace(self.max_tokens)
                self._last_frame = None
            fresh = sorted((r for r in view.recent_steps if r.seq > self.last_seq),
                           key=lambda r: r.seq)
            upto = fresh[0].seq if fresh else view.seq + 1  # e.g. a snapshot of a busy run
            if upto > self.last_seq + 1:
                self._fill_gap(upto)
            for r in fresh:
                self._take(r)
            if len(self.records) > MAX_RECORDS:
                del self.records[:len(self.records) - MAX_RECORDS]
            return list(self.records)

    def _take(self, r: StepRecord) -> None:
        self.records.append(r)
        self.schedule.add(r)
        self.last_seq = r.seq

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
        for r in got:
            self._take(r)

    def frame(self, view: Any, records: list[StepRecord]) -> RunFrame | AttachedFrame | None:
        """The frame of the view's folded step (None before the first snapshot). For
        ``kvscope attach``, an AttachedFrame. For an engine, the RunFrame with every part
        of that one step; when the parts cannot agree (the records ran ahead of a
        resyncing state, or the step's metrics are unknown) the last good frame again."""
        if view.state is None:
            return None
        if isinstance(view.state, HashCacheSnapshot):
            events = next((r.events for r in reversed(records) if r.seq == view.seq), [])
            return AttachedFrame("live", view.run_id or "live", view.state, events, records,
                                 view.config or {}, token_text_for(view.config),
                                 metrics=view.metrics or {})
        with self._lock:
            frame = self._build(view, records)
            if frame is None or not frame.consistent:
                self.dropped_frames += 1
                return self._last_frame
            self._last_frame = frame
            return frame

    def _build(self, view: Any, records: list[StepRecord]) -> RunFrame | None:
        step = view.state.step
        if records and records[-1].seq > view.seq:
            return None  # steps arrived that the state has not folded (resyncing)
        events_known = bool(records) and records[-1].seq == view.seq
        history = [r.metrics for r in records]
        if not events_known:  # the step itself was lost: its metrics came with a snapshot
            if view.seq >= 0 and (view.metrics or {}).get("step") != step:
                return None
            history = history + ([view.metrics] if view.seq >= 0 else [])
        # the schedule is read from the same records, so its last step is the frame's
        # (when the step itself was lost, the baseline stops short of it: not shown)
        schedule = self.schedule.snapshot() if events_known else None
        return RunFrame(source="live", key=view.run_id or "live", snapshot=view.state,
                        events=records[-1].events if events_known else [],
                        history=history, config=view.config or {}, schedule=schedule,
                        token_text=token_text_for(view.config), events_known=events_known)

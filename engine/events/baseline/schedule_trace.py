"""The paged run's schedule, per request, read from its StepRecords (what the contiguous
baseline replays, ``engine.events.baseline.contiguous``).

For every request: the step it arrived, the step the paged scheduler first scheduled it,
and its state at the end of every step from then on (``Moment``: running, waiting or
preempted, and the tokens its KV holds) until the step it finished. ``ScheduleTrace``
reads records one at a time, so a live view extends the schedule step by step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.events.schema.request_status import RequestStatus
from engine.events.schema.types import (
    RequestArrived, RequestFinished, RequestForked, RequestPreempted, RequestProgress,
    RequestScheduled,
)


@dataclass(frozen=True, slots=True)
class Moment:
    """A request's state at the end of one step: its status and the tokens in its KV."""

    status: RequestStatus
    num_computed_tokens: int


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of the paged run's schedule (lengths in tokens).

    ``moments[k]`` is its state at the end of step ``first_step + k``; it finished in
    step ``finish_step`` (= ``first_step + len(moments)`` once scheduled; None while it
    has not finished: its schedule is known only so far). ``first_step`` is None while
    the paged run never scheduled it (it waited, and perhaps was aborted waiting)."""

    request_id: str
    arrival_step: int
    prompt_len: int
    first_step: int | None
    moments: tuple[Moment, ...] = ()
    finish_step: int | None = None
    max_tokens: int | None = None
    max_len: int = 0  # the longest it got (prompt + generated)
    parent_id: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"{self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"{self.request_id}: max_tokens must be >= 1 or None")
        if self.first_step is not None:
            if self.first_step < self.arrival_step:
                raise ValueError(f"{self.request_id}: scheduled at {self.first_step} before it "
                                 f"arrived at {self.arrival_step}")
            if self.finish_step is not None and self.finish_step != self.first_step + len(self.moments):
                raise ValueError(f"{self.request_id}: finished at {self.finish_step}, but its "
                                 f"{len(self.moments)} moments from step {self.first_step} end "
                                 f"at {self.first_step + len(self.moments)}")

    @property
    def finished(self) -> bool:
        return self.finish_step is not None

    @property
    def length(self) -> int:
        return max(self.max_len, self.prompt_len)

    @classmethod
    def steady(cls, request_id: str, arrival_step: int, prompt_len: int, num_generated: int,
               max_tokens: int | None = None) -> TraceRequest:
        """A request the paged run started on arrival and ran every step, prefilling its
        prompt in the first and making one token per step: ``num_generated`` steps."""
        if num_generated < 1:
            raise ValueError(f"{request_id}: num_generated must be >= 1")
        moments = tuple(Moment(RequestStatus.RUNNING, prompt_len + k)
                        for k in range(num_generated - 1))
        return cls(request_id, arrival_step, prompt_len, arrival_step, moments,
                   arrival_step + num_generated - 1, max_tokens, prompt_len + num_generated)


@dataclass(slots=True)
class _Open:
    arrival_step: int
    prompt_len: int
    parent_id: str | None
    status: RequestStatus = RequestStatus.WAITING
    computed: int = 0
    max_len: int = 0
    first_step: int | None = None
    moments: list[Moment] = field(default_factory=list)
    finish_step: int | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A run's schedule as of ``last_step`` (None: no step yet): what ``simulate`` replays."""

    requests: tuple[TraceRequest, ...] = ()
    last_step: int | None = None


class ScheduleTrace:
    """The paged run's schedule (a ``TraceRequest`` per request), read from its
    StepRecords one at a time, so a live view extends it step by step. Statuses follow
    the reducer's rules (``engine.events.folds.rules``): arrived → waiting, scheduled →
    running, preempted, forked with blocks → running, finished → gone. A step missing
    from the records (lost by a live client) holds every state still.

    Writer: ``add`` (one caller at a time)."""

    def __init__(self, max_tokens: Mapping[str, int | None] | None = None) -> None:
        self.max_tokens = max_tokens if max_tokens is not None else {}
        self._open: dict[str, _Open] = {}
        self._order: list[str] = []
        self.last_step: int | None = None

    def add(self, record: Any) -> None:
        step = record.step
        if self.last_step is not None:
            if step <= self.last_step:
                return  # already read
            for lost in range(self.last_step + 1, step):
                self._close_step(lost)
        for e in record.events:
            self._event(e)
        self._close_step(step)
        self.last_step = step

    def _event(self, e: Any) -> None:
        if isinstance(e, RequestArrived):
            if e.request_id not in self._open:
                self._order.append(e.request_id)
                self._open[e.request_id] = _Open(e.step, e.num_prompt_tokens, None,
                                                 max_len=e.num_prompt_tokens)
            return
        if isinstance(e, RequestForked):
            if e.request_id not in self._open:
                self._fork(e)
            return
        if not isinstance(e, (RequestScheduled, RequestProgress, RequestPreempted,
                              RequestFinished)):
            return
        r = self._open.get(e.request_id)
        if r is None or r.finish_step is not None:
            return
        if isinstance(e, RequestScheduled):
            r.status = RequestStatus.RUNNING
            if r.first_step is None:
                r.first_step = e.step
        elif isinstance(e, RequestProgress):
            r.computed = e.num_computed_tokens
            r.max_len = max(r.max_len, e.num_tokens)
        elif isinstance(e, RequestPreempted):
            r.status, r.computed = RequestStatus.PREEMPTED, 0
        else:
            r.finish_step = e.step

    def _fork(self, e: RequestForked) -> None:
        self._order.append(e.request_id)
        child = _Open(e.step, e.num_tokens, e.parent_id, computed=e.num_computed_tokens,
                      max_len=e.num_tokens)
        if e.blocks:  # a table implies running (as the reducer says)
            child.status, child.first_step = RequestStatus.RUNNING, e.step
        self._open[e.request_id] = child

    def _close_step(self, step: int) -> None:
        for r in self._open.values():
            if r.first_step is not None and r.finish_step is None and step >= r.first_step:
                r.moments.append(Moment(r.status, r.computed))

    def _max_tokens(self, rid: str) -> int | None:
        """The request's max_tokens, looked up now (the mapping may be filled after the
        request arrived); a fork child without its own gets what its parent had left."""
        mt = self.max_tokens.get(rid)
        r = self._open[rid]
        if mt is None and r.parent_id in self._open:
            parent_mt = self._max_tokens(r.parent_id)
            if parent_mt is not None:
                mt = max(1, parent_mt - (r.prompt_len - self._open[r.parent_id].prompt_len))
        return mt

    def snapshot(self) -> Schedule:
        return Schedule(tuple(self.requests()), self.last_step)

    def requests(self) -> list[TraceRequest]:
        out = []
        for rid in self._order:
            r = self._open[rid]
            out.append(TraceRequest(rid, r.arrival_step, r.prompt_len, r.first_step,
                                    tuple(r.moments), r.finish_step, self._max_tokens(rid),
                                    r.max_len, r.parent_id))
        return out


def trace_from_records(records: Iterable[Any],
                       max_tokens: Mapping[str, int | None] | None = None) -> list[TraceRequest]:
    """The schedule's requests of a run from its StepRecords (``ScheduleTrace``);
    ``max_tokens`` maps request id → its max_tokens param (a fork child without its
    own entry gets the parent's budget left at the fork)."""
    return list(schedule_of(records, max_tokens).requests)


def schedule_of(records: Iterable[Any],
                max_tokens: Mapping[str, int | None] | None = None) -> Schedule:
    """The ``Schedule`` of a recorded (or live) run's StepRecords."""
    trace = ScheduleTrace(max_tokens)
    for rec in records:
        trace.add(rec)
    return trace.snapshot()

"""Contiguous-allocation baseline: this run's schedule replayed on a contiguous allocator.

(Past 300 lines because this docstring is the baseline's whole specification, ~55 lines;
the simulator, its figures and the paged comparison are one concept, ~250 lines of code.)

Pre-PagedAttention servers reserved one contiguous KV region per request. This puts the
paged run beside that, on a linear array of ``capacity`` token slots (= the paged
pool's num_blocks * block_size), changing one thing only: where memory comes from.

What is replayed, exactly. The input is the paged run's own schedule, per request
(``TraceRequest``): the step it arrived, the step the paged scheduler first scheduled
it, and its state at the end of every step from then on (running, waiting or
preempted, and the tokens its KV holds) until the step it finished. The scheduler's
decisions (token budget, max_num_seqs, chunking, preemption) are not re-simulated:
the paged run already made them. The baseline adds the contiguous allocator's rule:
a request may start only once one free run of slots as long as its reservation
exists, and it holds that region from its start until it finishes.

Step ``t`` (the paged run's step numbers; rows for every step from the first):
1. Admission, first come first served in the order the paged run first scheduled the
   requests (fork children at their fork). The head may start once the paged run had
   started it, ``delay`` steps later (``first_step + delay <= t``), and a free run of
   its reservation exists (first fit: the lowest-addressed run long enough).
   Admission stops at the first head that cannot start (no skipping). A head whose
   reservation exceeds the capacity can never start: it is rejected and counted.
2. A request started ``d`` steps after the paged run started it follows the paged
   request's states ``d`` steps late; ``delay`` is the largest ``d`` so far, so every
   later request waits at least as long (the schedule after a wait is the paged one,
   shifted: its order and spacing are kept). A fork child is seen, waiting, from its
   fork in the parent's shifted schedule.
3. Figures at the end of the step, as the paged metrics count them (requests that
   finished in the step have left and freed their region).

Consequences (tests/events/test_baseline.py): while every region fits, every delay is
0 and the running and waiting counts equal the paged run's at every step; with delays
the contiguous run spends the same request-steps running over at least as many steps,
so its mean concurrency never exceeds the paged run's. A live run is replayed up to its
last step; steps past it are added only once every request's schedule is complete.

Reservation per request: ``max_model_len`` (variant ``max_model_len``) or
``min(prompt + max_tokens, max_model_len)`` (variant ``prompt_plus_max_tokens``;
``max_model_len`` when max_tokens is unknown); never less than the request's longest
length seen. A fork child's prompt is its length at the fork (contiguous memory
cannot share: the child copies its parent's tokens).

Per-step figures (slots are token slots):
- ``used_slots``: tokens held in the KV of started, unfinished requests (at their
  shifted state; a preempted request holds none).
- ``reserved_slots``: sum of their reservations; ``reserved_unused_slots`` =
  reserved − used (over-reservation, the waste paging removes).
- ``free_slots`` = capacity − reserved; ``largest_free_run``: longest contiguous free run.
- ``external_fragmentation`` = 1 − largest_free_run / free_slots (0.0 with no free
  slot): the share of free space outside the largest hole.
- ``blocked_by_fragmentation``: the head waits, its reservation ≤ free_slots but >
  largest_free_run (it would fit if free space were contiguous).
- ``stranded_free_slots`` = free_slots when blocked_by_fragmentation, else 0.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.events.baseline.schedule_trace import (  # noqa: F401  (re-exported: the trace's types)
    Moment, Schedule, ScheduleTrace, TraceRequest, schedule_of, trace_from_records,
)
from engine.events.folds.pool_state import PoolState
from engine.events.metrics.pool_summary import PoolSummary
from engine.events.schema.request_status import RequestStatus


class Reservation(enum.Enum):
    MAX_MODEL_LEN = "max_model_len"
    PROMPT_PLUS_MAX_TOKENS = "prompt_plus_max_tokens"


@dataclass(frozen=True, slots=True)
class BaselineConfig:
    capacity: int  # token slots, = num_blocks * block_size of the paged run
    max_model_len: int
    reservation: Reservation

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {self.capacity!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive integer, got {self.max_model_len!r}")
        if not isinstance(self.reservation, Reservation):
            raise ValueError(f"reservation must be a Reservation, got {self.reservation!r}")

    def reserve(self, r: TraceRequest) -> int:
        """Slots reserved for ``r`` under this variant."""
        if self.reservation is Reservation.PROMPT_PLUS_MAX_TOKENS and r.max_tokens is not None:
            want = min(r.prompt_len + r.max_tokens, self.max_model_len)
        else:
            want = self.max_model_len
        return max(want, r.length)


@dataclass(frozen=True, slots=True)
class BaselineStep:
    step: int
    num_running: int
    num_waiting: int
    used_slots: int
    reserved_slots: int
    reserved_unused_slots: int
    free_slots: int
    largest_free_run: int
    external_fragmentation: float
    blocked_by_fragmentation: bool
    stranded_free_slots: int


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summarize(steps: list[BaselineStep], capacity: int) -> dict[str, Any]:
    """Run-level figures over per-step rows (baseline or paged)."""
    reserved = sum(s.reserved_slots for s in steps)
    return {
        "num_steps": len(steps),
        "mean_concurrency": _mean([s.num_running for s in steps]),
        "max_concurrency": max((s.num_running for s in steps), default=0),
        "mean_used_slots": _mean([s.used_slots for s in steps]),
        "mean_reserved_unused_slots": _mean([s.reserved_unused_slots for s in steps]),
        # share of everything reserved (summed over steps) that held no token
        "reserved_unused_fraction": (sum(s.reserved_unused_slots for s in steps) / reserved
                                     if reserved else 0.0),
        "mean_used_fraction": _mean([s.used_slots / capacity for s in steps]),
        "mean_external_fragmentation": _mean([s.external_fragmentation for s in steps]),
        "steps_blocked_by_fragmentation": sum(s.blocked_by_fragmentation for s in steps),
        "mean_stranded_free_slots": _mean([s.stranded_free_slots for s in steps]),
    }


@dataclass(frozen=True, slots=True)
class BaselineResult:
    config: BaselineConfig
    steps: tuple[BaselineStep, ...]
    rejected: tuple[str, ...]  # request ids whose reservation exceeds the capacity
    delays: dict[str, int] = field(default_factory=dict)  # started request → steps late

    def summary(self) -> dict[str, Any]:
        out = summarize(list(self.steps), self.config.capacity)
        out.update(variant=self.config.reservation.value, capacity=self.config.capacity,
                   num_rejected=len(self.rejected),
                   max_delay=max(self.delays.values(), default=0))
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.steps]


def _free_runs(regions: list[tuple[int, int]], capacity: int) -> list[tuple[int, int]]:
    """(start, length) of free runs, given regions sorted by start."""
    runs, pos = [], 0
    for start, size in regions:
        if start > pos:
            runs.append((pos, start - pos))
        pos = start + size
    if pos < capacity:
        runs.append((pos, capacity - pos))
    return runs


@dataclass(slots=True)
class _Started:
    request: TraceRequest
    start: int  # first slot of its region
    size: int
    at: int  # the step it started; its state at step t is moments[t - at]


def simulate(trace: Iterable[TraceRequest], config: BaselineConfig,
             last_step: int | None = None) -> BaselineResult:
    """Replay the schedule ``trace`` on a contiguous allocator (the module docstring's
    model). ``last_step``: the paged run's last step (default: the trace's latest known
    state); rows go on past it only while every request's schedule is complete."""
    reqs = list(trace)
    if not reqs:
        return BaselineResult(config, (), (), {})
    # FCFS in the order the paged run started them (stable: ties keep the trace's order)
    queue = sorted((r for r in reqs if r.first_step is not None), key=lambda r: r.first_step)
    known = [r.arrival_step for r in reqs] + [
        r.first_step + len(r.moments) - (r.finished is False) for r in queue]
    last = max(known) if last_step is None else last_step
    complete = all(r.finished for r in reqs)
    cap = config.capacity
    started: list[_Started] = []
    delays: dict[str, int] = {}
    rejected: set[str] = set()
    unstarted = list(reqs)  # neither started nor rejected (may not have arrived yet)
    rows: list[BaselineStep] = []
    delay, head = 0, 0
    t = min(r.arrival_step for r in reqs)
    while t <= last or (complete and (started or head < len(queue))):
        # 1. admission: FCFS, no skipping; regions of this step's finishers are still held
        while head < len(queue):
            r = queue[head]
            need = config.reserve(r)
            if need > cap or r.parent_id in rejected:
                rejected.add(r.request_id)
                head += 1
                continue
            if r.parent_id is not None and r.parent_id not in delays:
                break  # its parent has not started, so it cannot have forked yet
            if t < r.first_step + delay:
                break
            regions = sorted((s.start, s.size) for s in started)
            start = next((p for p, n in _free_runs(regions, cap) if n >= need), None)
            if start is None:
                break
            delay = t - r.first_step
            delays[r.request_id] = delay
            started.append(_Started(r, start, need, t))
            head += 1
        if len(unstarted) != len(reqs) - len(delays) - len(rejected):
            unstarted = [r for r in unstarted
                         if r.request_id not in delays and r.request_id not in rejected]
        # 2.-3. shifted states, after this step's finishers left
        started = [s for s in started if t - s.at < len(s.request.moments)]
        states = [s.request.moments[t - s.at] for s in started]
        running = sum(m.status is RequestStatus.RUNNING for m in states)
        waiting = len(states) - running + sum(_waiting(r, t, delays) for r in unstarted)
        regions = sorted((s.start, s.size) for s in started)
        reserved = sum(n for _, n in regions)
        used = sum(m.num_computed_tokens for m in states)
        free = cap - reserved
        largest = max((n for _, n in _free_runs(regions, cap)), default=0)
        nxt = queue[head] if head < len(queue) else None
        head_need = (config.reserve(nxt) if nxt is not None and t >= nxt.first_step + delay
                     else None)
        blocked = head_need is not None and largest < head_need <= free
        rows.append(BaselineStep(
            step=t, num_running=running, num_waiting=waiting, used_slots=used,
            reserved_slots=reserved, reserved_unused_slots=reserved - used, free_slots=free,
            largest_free_run=largest,
            external_fragmentation=1.0 - largest / free if free else 0.0,
            blocked_by_fragmentation=blocked, stranded_free_slots=free if blocked else 0))
        t += 1
    return BaselineResult(config, tuple(rows), tuple(sorted(rejected)), delays)


def _waiting(r: TraceRequest, t: int, delays: Mapping[str, int]) -> bool:
    """Whether a request that has not started waits at step ``t``: it arrived (a fork
    child: its fork came in the parent's shifted schedule) and, if the paged run never
    scheduled it, had not left yet (aborted while waiting)."""
    if r.parent_id is None:
        arrived = r.arrival_step <= t
    else:
        d = delays.get(r.parent_id)
        arrived = d is not None and r.arrival_step + d <= t
    gone = r.first_step is None and r.finish_step is not None and r.finish_step <= t
    return arrived and not gone


# ---- from a recorded run -----------------------------------------------------

def replay(records: Iterable[Any], config: BaselineConfig,
           max_tokens: Mapping[str, int | None] | None = None) -> BaselineResult:
    """``simulate`` over the schedule of a recorded (or live) run."""
    sched = schedule_of(records, max_tokens)
    return simulate(sched.requests, config, sched.last_step)


def paged_step(pool: PoolSummary) -> BaselineStep:
    """The paged engine's row for one pool summary, on the baseline's scale.

    ``reserved_slots`` = slots of referenced blocks (shared once), ``used_slots`` =
    their filled slots; free space is the free block count (any block fits any
    request, so external fragmentation is 0 by construction)."""
    bs = pool.block_size
    reserved = pool.num_used_blocks * bs
    free = pool.num_blocks * bs - reserved
    return BaselineStep(
        step=pool.step, num_running=pool.num_requests_running,
        num_waiting=pool.num_requests_waiting + pool.num_requests_preempted,
        used_slots=pool.num_filled_slots, reserved_slots=reserved,
        reserved_unused_slots=reserved - pool.num_filled_slots, free_slots=free,
        largest_free_run=free, external_fragmentation=0.0, blocked_by_fragmentation=False,
        stranded_free_slots=0)


def paged_steps(records: Iterable[Any], num_blocks: int, block_size: int) -> list[BaselineStep]:
    """The paged engine's rows (``paged_step``), by replaying the run's events."""
    state = PoolState(num_blocks, block_size)
    rows = []
    for rec in records:
        state.apply_step(rec)
        rows.append(paged_step(state.summary()))
    return rows


def compare(records: list[Any], num_blocks: int, block_size: int, max_model_len: int,
            max_tokens: Mapping[str, int | None] | None = None) -> dict[str, dict[str, Any]]:
    """Summaries keyed ``paged``, ``max_model_len``, ``prompt_plus_max_tokens``."""
    cap = num_blocks * block_size
    sched = schedule_of(records, max_tokens)
    out = {"paged": {**summarize(paged_steps(records, num_blocks, block_size), cap),
                     "variant": "paged", "capacity": cap, "num_rejected": 0}}
    for variant in Reservation:
        out[variant.value] = simulate(sched.requests, BaselineConfig(cap, max_model_len, variant),
                                      sched.last_step).summary()
    return out

"""Contiguous-allocation baseline: the same request trace without paging.

Pre-PagedAttention servers reserved one contiguous KV region per request. This
simulates that on a linear array of ``capacity`` token slots (= the paged pool's
num_blocks * block_size) so the dashboard can put both side by side.

Model (deliberately simple, and the same for both variants):
- A step ``t`` runs: (1) requests whose ``arrival_step <= t`` join the waiting queue
  in arrival order; (2) FCFS admission: the head is placed first-fit (the
  lowest-addressed free run that is long enough); admission stops at the first
  head that does not fit (no skipping); (3) every running request gains one token
  (the admission step processes the prompt and yields the first token); (4) the
  figures below are measured; (5) requests that reached their generated count
  leave and their region is freed. Steps where nothing is running or waiting are
  skipped up to the next arrival.
- Reservation per request: ``max_model_len`` (variant ``max_model_len``) or
  ``min(prompt + max_tokens, max_model_len)`` (variant ``prompt_plus_max_tokens``;
  ``max_model_len`` when max_tokens is unknown); never less than what the request
  actually used. A request whose reservation exceeds the capacity can never run;
  it is rejected and counted.

Per-step figures (slots are token slots):
- ``used_slots``: prompt + generated tokens of running requests.
- ``reserved_slots``: sum of running reservations; ``reserved_unused_slots`` =
  reserved − used (over-reservation, the waste paging removes).
- ``free_slots`` = capacity − reserved; ``largest_free_run``: longest contiguous free run.
- ``external_fragmentation`` = 1 − largest_free_run / free_slots (0.0 with no free
  slot): the share of free space outside the largest hole.
- ``blocked_by_fragmentation``: a request waits at the head, its reservation
  ≤ free_slots but > largest_free_run (it would fit if free space were contiguous).
- ``stranded_free_slots`` = free_slots when blocked_by_fragmentation, else 0: free
  slots the next request cannot use only because they are not contiguous.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from engine.events.pool_state import PoolState
from engine.events.pool_summary import PoolSummary
from engine.events.types import RequestArrived, RequestForked, RequestProgress


class Reservation(enum.Enum):
    MAX_MODEL_LEN = "max_model_len"
    PROMPT_PLUS_MAX_TOKENS = "prompt_plus_max_tokens"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request as the baseline sees it (lengths in tokens)."""

    request_id: str
    arrival_step: int
    prompt_len: int
    num_generated: int
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"{self.request_id}: prompt_len must be >= 1, got {self.prompt_len}")
        if self.num_generated < 0:
            raise ValueError(f"{self.request_id}: num_generated must be >= 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"{self.request_id}: max_tokens must be >= 1 or None")


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
        return max(want, r.prompt_len + r.num_generated)


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

    def summary(self) -> dict[str, Any]:
        out = summarize(list(self.steps), self.config.capacity)
        out.update(variant=self.config.reservation.value, capacity=self.config.capacity,
                   num_rejected=len(self.rejected))
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


def simulate(trace: Iterable[TraceRequest], config: BaselineConfig) -> BaselineResult:
    """Run the trace on a contiguous allocator (see module docstring for the model)."""
    pending = deque(sorted(trace, key=lambda r: r.arrival_step))  # stable: keeps arrival order
    waiting: deque[TraceRequest] = deque()
    running: list[list] = []  # [start, size, request, generated]
    rejected: list[str] = []
    rows: list[BaselineStep] = []
    cap = config.capacity
    t = pending[0].arrival_step if pending else 0
    while pending or waiting or running:
        if not waiting and not running and pending[0].arrival_step > t:
            t = pending[0].arrival_step  # idle: jump to the next arrival
        while pending and pending[0].arrival_step <= t:
            waiting.append(pending.popleft())
        while waiting:
            r = waiting[0]
            need = config.reserve(r)
            if need > cap:
                rejected.append(waiting.popleft().request_id)
                continue
            regions = sorted((s[0], s[1]) for s in running)
            start = next((p for p, n in _free_runs(regions, cap) if n >= need), None)
            if start is None:
                break
            running.append([start, need, waiting.popleft(), 0])
        for s in running:
            if s[3] < s[2].num_generated:
                s[3] += 1
        regions = sorted((s[0], s[1]) for s in running)
        reserved = sum(n for _, n in regions)
        used = sum(s[2].prompt_len + s[3] for s in running)
        free = cap - reserved
        largest = max((n for _, n in _free_runs(regions, cap)), default=0)
        head_need = config.reserve(waiting[0]) if waiting else None
        blocked = head_need is not None and largest < head_need <= free
        rows.append(BaselineStep(
            step=t, num_running=len(running), num_waiting=len(waiting), used_slots=used,
            reserved_slots=reserved, reserved_unused_slots=reserved - used, free_slots=free,
            largest_free_run=largest,
            external_fragmentation=1.0 - largest / free if free else 0.0,
            blocked_by_fragmentation=blocked, stranded_free_slots=free if blocked else 0))
        running = [s for s in running if s[3] < s[2].num_generated]
        t += 1
    return BaselineResult(config, tuple(rows), tuple(rejected))


# ---- from a recorded run -----------------------------------------------------

def trace_from_records(records: Iterable[Any],
                       max_tokens: Mapping[str, int | None] | None = None) -> list[TraceRequest]:
    """Build the trace from StepRecords: arrivals (and forks) with their lengths and the
    tokens actually generated; ``max_tokens`` maps request id → its max_tokens param
    (a fork child without its own entry inherits the parent's remaining budget)."""
    max_tokens = max_tokens or {}
    order: list[str] = []
    info: dict[str, dict[str, Any]] = {}
    final: dict[str, int] = {}
    for rec in records:
        for e in rec.events:
            if isinstance(e, RequestArrived) and e.request_id not in info:
                order.append(e.request_id)
                info[e.request_id] = {"step": e.step, "prompt": e.num_prompt_tokens,
                                      "max": max_tokens.get(e.request_id)}
            elif isinstance(e, RequestForked) and e.request_id not in info:
                # Without sharing, a fork child needs its own copy of every token it starts with.
                parent = info.get(e.parent_id)
                mt = max_tokens.get(e.request_id)
                if mt is None and parent is not None and parent["max"] is not None:
                    mt = max(1, parent["max"] - (e.num_tokens - parent["prompt"]))
                order.append(e.request_id)
                info[e.request_id] = {"step": e.step, "prompt": e.num_tokens, "max": mt}
                final[e.request_id] = e.num_tokens
            elif isinstance(e, RequestProgress):
                final[e.request_id] = e.num_tokens
    return [TraceRequest(rid, info[rid]["step"], info[rid]["prompt"],
                         max(0, final.get(rid, info[rid]["prompt"]) - info[rid]["prompt"]),
                         info[rid]["max"])
            for rid in order]


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
    trace = trace_from_records(records, max_tokens)
    out = {"paged": {**summarize(paged_steps(records, num_blocks, block_size), cap),
                     "variant": "paged", "capacity": cap, "num_rejected": 0}}
    for variant in Reservation:
        out[variant.value] = simulate(trace, BaselineConfig(cap, max_model_len, variant)).summary()
    return out

"""What a preset actually did, read from the run's steps: the check of its claim.

Pure: StepRecords in, counts out. Only the preset's own requests (and their fork
samples) count, so other clients' work on the same engine cannot make a preset look
as if it worked. The Submit page shows ``verdict`` under each preset it ran; the
browser test asserts it for every preset on the default model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.request import child_request_id
from engine.events.schema.types import (
    BlockEvicted, CowCopy, EvictionReason, PrefixHit, RequestArrived, RequestFinished,
    RequestForked, RequestPreempted, RequestScheduled, ScheduledPhase,
)

MAX_SAMPLES = 16  # fork sample ids looked for per request (the server caps n lower)


@dataclass(slots=True)
class Effects:
    """Counts over the preset's requests. ``chunked_steps``: steps that ran a prefill
    chunk of the longest prompt short of its end; ``starved_steps``: of those, steps in
    which a request that was already decoding got no token."""

    requests: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    hit_tokens: int = 0
    hits: int = 0
    copies: int = 0
    preemptions: int = 0
    evictions: int = 0  # LRU evictions of any block while the preset ran (reason reuse)
    chunked_steps: int = 0
    starved_steps: int = 0
    longest_prompt: int = 0
    first_step: int | None = None
    last_step: int | None = None
    first_ts: float | None = None
    last_ts: float | None = None

    @property
    def done(self) -> bool:
        return bool(self.requests) and self.requests <= self.finished

    @property
    def seconds(self) -> float | None:
        """Wall time from the step its first request arrived to the last one seen."""
        if self.first_ts is None or self.last_ts is None:
            return None
        return self.last_ts - self.first_ts


def effects(records: Iterable[Any], request_ids: Sequence[str]) -> Effects:
    """Count what the steps did to ``request_ids`` (and the samples forked from them)."""
    ours = set(request_ids)
    ours |= {child_request_id(r, k) for r in request_ids for k in range(1, MAX_SAMPLES)}
    out = Effects()
    prompts: dict[str, int] = {}
    decoding: set[str] = set()  # ours that have made a decode step
    for rec in records:
        evs = rec.events
        mine = [e for e in evs if getattr(e, "request_id", None) in ours
                or (type(e) is RequestForked and e.parent_id in ours)]
        if out.first_step is None and not any(type(e) is RequestArrived for e in mine):
            continue  # before the preset
        for e in mine:
            t = type(e)
            if t is RequestArrived:
                out.requests.add(e.request_id)
                prompts[e.request_id] = e.num_prompt_tokens
                if out.first_step is None:
                    out.first_step, out.first_ts = rec.step, rec.ts
            elif t is RequestForked:
                ours.add(e.request_id)
                out.requests.add(e.request_id)
            elif t is RequestFinished:
                out.finished.add(e.request_id)
            elif t is PrefixHit:
                out.hits += 1
                out.hit_tokens += e.num_tokens
            elif t is CowCopy:
                out.copies += 1
            elif t is RequestPreempted:
                out.preemptions += 1
        out.evictions += sum(1 for e in evs if type(e) is BlockEvicted
                             and e.reason is EvictionReason.REUSE)
        _chunking(out, mine, prompts, decoding)
        if out.first_step is not None:
            out.last_step, out.last_ts = rec.step, rec.ts
    out.longest_prompt = max(prompts.values(), default=0)
    return out


def _chunking(out: Effects, mine: list[Any], prompts: dict[str, int], decoding: set[str]) -> None:
    """One step: did the longest prompt run a chunk short of its end, and did every
    request that was decoding before this step get its token?"""
    if not prompts:
        return
    longest = max(prompts, key=prompts.get)
    sched = {e.request_id: e for e in mine if type(e) is RequestScheduled}
    gone = {e.request_id for e in mine if type(e) in (RequestFinished, RequestPreempted)}
    chunk = sched.get(longest)
    if (chunk is not None and chunk.phase is ScheduledPhase.PREFILL
            and chunk.num_computed_tokens + chunk.num_tokens < prompts[longest]):
        out.chunked_steps += 1
        if any(r not in sched and r not in gone for r in decoding):
            out.starved_steps += 1
    decoding |= {r for r, e in sched.items() if e.phase is ScheduledPhase.DECODE}
    decoding -= gone


def verdict(effect: str, fx: Effects) -> tuple[bool, str]:
    """(shown, words): whether the run shows the preset's claim, and what it shows."""
    if effect == "hits":
        return fx.hit_tokens > 0, (f"{fx.hits} prefix-cache hit{'' if fx.hits == 1 else 's'}, "
                                   f"{fx.hit_tokens} prompt tokens not recomputed")
    if effect == "copies":
        return fx.copies > 0, (f"{fx.copies} copy-on-write "
                               f"cop{'y' if fx.copies == 1 else 'ies'}")
    if effect == "chunked":
        ok = fx.chunked_steps >= 3 and fx.starved_steps == 0
        return ok, (f"the {fx.longest_prompt}-token prompt ran in chunks over "
                    f"{fx.chunked_steps + 1} steps; the decoding requests got a token in "
                    + ("every one of them" if not fx.starved_steps
                       else f"all but {fx.starved_steps}"))
    if effect == "pressure":
        return fx.preemptions > 0 and fx.evictions > 0, (
            f"{fx.preemptions} preemption{'' if fx.preemptions == 1 else 's'}, "
            f"{fx.evictions} LRU eviction{'' if fx.evictions == 1 else 's'}")
    raise ValueError(f"unknown preset effect {effect!r}")

"""The step-cost model: how long one engine step takes, from what it scheduled.

``seconds = base + per_prefill_token × prefill tokens + per_decode_seq × decode sequences
+ per_context_token × context tokens`` (context: the tokens every scheduled request
attends over, ``seq_len``). Times (TTFT, ITL, queueing, throughput) come out of it; hit
rates, evictions and preemptions do not depend on it (the core decides those from the
order of arrivals and steps alone).

Coefficients are given (``--step-cost base,prefill,decode,context``), or fitted by least
squares from a recorded engine run's steps (``fit_from_run``: each step's scheduled
tokens from its events, its duration from the time between back-to-back steps), or read
from a table fitted that way (``data/step_cost/*.json``, one per model and device).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from engine.core.scheduler_output import SchedulerOutput
from engine.events.schema.types import ScheduledPhase

_PHASE, _TOKENS, _START = attrgetter("phase"), attrgetter("token_ids"), attrgetter("start_position")
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "step_cost"


@dataclass(frozen=True, slots=True)
class StepCost:
    base: float
    per_prefill_token: float
    per_decode_seq: float
    per_context_token: float
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("base", "per_prefill_token", "per_decode_seq", "per_context_token"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"step cost {name} must be a number >= 0, got {v!r}")

    def seconds(self, prefill: int, decode: int, context: int) -> float:
        return (self.base + self.per_prefill_token * prefill + self.per_decode_seq * decode
                + self.per_context_token * context)

    def of(self, out: SchedulerOutput) -> float:
        """A decode entry computes one token, a prefill chunk its ``token_ids``; every entry
        attends over ``start_position + len(token_ids)`` (counted in C, not per entry)."""
        s = out.scheduled
        decode = list(map(_PHASE, s)).count(ScheduledPhase.DECODE)
        new = sum(map(len, map(_TOKENS, s)))
        return self.seconds(new - decode, decode, sum(map(_START, s)) + new)

    @classmethod
    def parse(cls, text: str) -> StepCost:
        """``base,prefill,decode,context`` (seconds), or the path / name of a table."""
        parts = text.split(",")
        if len(parts) == 4:
            try:
                return cls(*(float(p) for p in parts), source="given")
            except ValueError as exc:
                raise ValueError(f"--step-cost {text!r}: {exc}") from None
        path = Path(text)
        if not path.is_file():
            path = DATA_DIR / f"{text}.json"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in DATA_DIR.glob("*.json"))) or "none"
            raise ValueError(f"--step-cost {text!r}: neither four numbers (base,prefill,decode,"
                             f"context) nor a table (known: {known})")
        d = json.loads(path.read_text())
        return cls(d["base"], d["per_prefill_token"], d["per_decode_seq"], d["per_context_token"],
                   source=str(path))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_cost() -> StepCost:
    """The shipped table of the default model on this project's CPU box."""
    return StepCost.parse("smollm2-135m-cpu")


def step_features(events: list) -> tuple[int, int, int]:
    """(prefill tokens, decode sequences, context tokens) of one recorded step."""
    prefill = decode = context = 0
    for e in events:
        if e.type == "request_scheduled":
            if e.phase is ScheduledPhase.DECODE:
                decode += 1
            else:
                prefill += e.num_tokens
            context += e.num_computed_tokens + e.num_tokens
    return prefill, decode, context


def fit(rows: list[tuple[int, int, int, float]], source: str) -> StepCost:
    """Least squares of seconds on (1, prefill, decode, context), coefficients kept >= 0
    (a coefficient the fit drives negative is dropped and the rest refitted)."""
    import numpy as np

    if len(rows) < 8:
        raise ValueError(f"{len(rows)} timed steps: too few to fit a step cost (need 8)")
    a = np.array([[1.0, p, d, c] for p, d, c, _ in rows])
    y = np.array([t for *_, t in rows])
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    full = [0.0] * 4
    for k, v in zip(keep, coef):
        full[k] = max(0.0, float(v))
    return StepCost(*full, source=source)


def fit_from_run(store: Any, run_id: str) -> StepCost:
    """Fit on a recorded engine run: a step's duration is its end time minus the end of
    the step before, counted only where the engine was busy across both (consecutive
    steps, the one before left requests running or waiting, this one scheduled some)."""
    rows = []
    prev = None
    for rec in store.load_steps(run_id):
        p, d, c = step_features(rec.events)
        m = prev.metrics if prev is not None else {}
        busy = (m.get("num_requests_running") or 0) + (m.get("num_requests_waiting") or 0)
        if prev is not None and rec.step == prev.step + 1 and busy and (p or d):
            dt = rec.ts - prev.ts
            if dt > 0:
                rows.append((p, d, c, dt))
        prev = rec
    return fit(rows, f"run:{run_id}")

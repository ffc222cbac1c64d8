"""A scenario's workload (``Req``) and what one run of it left behind (``Trace``).

Plain Python, no torch: a Trace holds the run's StepRecords, the requests'
outputs and the engine's effective config, and answers questions about them by
reading events and metrics, or by folding events with the shared reducer
(``PoolState``), exactly as Replay does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core import SamplingParams
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.reducer import PoolState
from engine.events.schema.step import StepRecord
from engine.events.schema.types import Event, PrefixLookup, RequestProgress


@dataclass(frozen=True, slots=True)
class Req:
    """One request of a workload; it is added before driver step ``arrive_step``."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrive_step: int = 0


def greedy(max_tokens: int, **kw: Any) -> SamplingParams:
    """Greedy sampling that runs exactly ``max_tokens`` tokens (ignores EOS), so block
    counts do not depend on what the model happens to say."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


@dataclass(slots=True)
class Trace:
    """One recorded scenario run. ``outputs[rid]``: token_ids and texts per sample,
    finish_reasons, ttft_s, num_cached_tokens, num_prompt_tokens, arrive_step."""

    variant: str
    label: str
    run_id: str | None
    config: dict[str, Any]
    records: list[StepRecord]
    outputs: dict[str, dict[str, Any]]
    wall_s: float
    model_facts: dict[str, Any] = field(default_factory=dict)

    # ---- metrics ---------------------------------------------------------------

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    def series(self, name: str) -> list[Any]:
        return [r.metrics.get(name) for r in self.records]

    def final(self, name: str, default: Any = None) -> Any:
        return self.records[-1].metrics.get(name, default) if self.records else default

    def peak(self, name: str) -> Any:
        return max((v for v in self.series(name) if v is not None), default=0)

    def mean(self, name: str) -> float:
        vals = [v for v in self.series(name) if v is not None]
        return sum(vals) / len(vals) if vals else 0.0

    def throughput(self) -> float:
        """Output tokens per second of wall time over the whole run."""
        return self.final("num_output_tokens", 0) / self.wall_s if self.wall_s > 0 else 0.0

    # ---- events ----------------------------------------------------------------

    def events(self, *types: type[Event]) -> list[Event]:
        return [e for r in self.records for e in r.events if not types or isinstance(e, types)]

    def first_step(self, etype: type[Event],
                   pred: Callable[[Event], bool] | None = None) -> int | None:
        """The first step holding an event of ``etype`` (matching ``pred``)."""
        for r in self.records:
            if any(isinstance(e, etype) and (pred is None or pred(e)) for e in r.events):
                return r.step
        return None

    def lookups(self) -> dict[str, PrefixLookup]:
        """Each request's prefix-cache lookup at its first admission."""
        out: dict[str, PrefixLookup] = {}
        for e in self.events(PrefixLookup):
            out.setdefault(e.request_id, e)
        return out

    def first_token_step(self, rid: str) -> int | None:
        return self.first_step(RequestProgress,
                               lambda e: e.request_id == rid and bool(e.new_token_ids))

    # ---- pool state --------------------------------------------------------------

    def states(self) -> list[tuple[int, PoolState]]:
        """(step, folded state after it) for every step; O(steps) copies, so only
        for the small pools lessons use."""
        s = PoolState(self.config["num_blocks"], self.config["block_size"])
        out = []
        for r in self.records:
            s.apply_step(r)
            out.append((r.step, s.copy()))
        return out

    def snapshot_at(self, step: int | None = None) -> PoolSnapshot:
        """The pool after ``step`` (default: the last), rebuilt from the events."""
        s = PoolState(self.config["num_blocks"], self.config["block_size"])
        for r in self.records:
            if step is not None and r.step > step:
                break
            s.apply_step(r)
        return s.to_snapshot()

    def ref(self, step: int | None = None) -> dict[str, Any]:
        """How to find this run again (the JSON's ``runs`` entries)."""
        keys = ("num_blocks", "block_size", "max_model_len", "max_num_batched_tokens",
                "enable_prefix_caching", "enable_chunked_prefill", "kv_bytes_per_block")
        return {"run_id": self.run_id, "label": self.label, "variant": self.variant,
                "focus_step": step, "num_steps": len(self.records),
                "config": {k: self.config.get(k) for k in keys}}


def by_arrival(reqs: Sequence[Req]) -> list[Req]:
    return sorted(reqs, key=lambda r: r.arrive_step)

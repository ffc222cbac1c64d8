"""Paged vs contiguous: this run's schedule on a contiguous allocator (what-if figures).

The replay itself is ``engine.events.baseline.contiguous`` (the paged run's own schedule, same
pool capacity in token slots, starts delayed until a contiguous region is free); this
module lines its rows up with the paged run's steps for the side-by-side bars and
tables. Both sides cover the same steps: the paged rows come from the metrics of the
records the schedule was read from.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events.baseline import contiguous as baseline
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.metrics.pool_summary import PoolSummary

VARIANT_LABELS = {
    "paged": "paged (this engine)",
    baseline.Reservation.MAX_MODEL_LEN.value: "contiguous, reserve max_model_len",
    baseline.Reservation.PROMPT_PLUS_MAX_TOKENS.value: "contiguous, reserve prompt + max_tokens",
}


@dataclass(frozen=True, slots=True)
class Baselines:
    """Both contiguous variants of one run, plus the paged rows on the same scale."""

    capacity: int
    results: dict[str, baseline.BaselineResult]  # variant value → simulation
    paged: list[baseline.BaselineStep]
    last_step: int | None = None  # the paged run's last step the replay knows

    def row_at(self, variant: str, step: int) -> baseline.BaselineStep | None:
        """The variant's row of exactly ``step`` (None where it has none: a split of the
        pool must not show another step's contiguous state)."""
        rows = self.paged if variant == "paged" else self.results[variant].steps
        i = bisect.bisect_left(rows, step, key=lambda r: r.step)
        return rows[i] if i < len(rows) and rows[i].step == step else None

    def summaries(self) -> dict[str, dict[str, Any]]:
        out = {"paged": {**baseline.summarize(self.paged, self.capacity), "variant": "paged",
                         "capacity": self.capacity, "num_rejected": 0}}
        for v, res in self.results.items():
            out[v] = res.summary()
        return out


def summary_from_metrics(m: dict[str, Any], num_blocks: int,
                         block_size: int) -> PoolSummary | None:
    """The PoolSummary a step's metrics dict was made from (None: not a pool step)."""
    used_blocks = m.get("num_used_blocks")
    if used_blocks is None or m.get("step") is None:
        return None
    filled = m.get("num_filled_slots")
    if filled is None:  # recorded before the metrics carried it
        filled = round((m.get("kv_token_usage") or 0.0) * num_blocks * block_size)
    return PoolSummary(
        step=int(m["step"]), block_size=block_size, num_blocks=num_blocks,
        num_used_blocks=int(used_blocks), num_filled_slots=int(filled),
        num_shared_blocks=int(m.get("num_shared_blocks", 0)),
        num_cached_free_blocks=int(m.get("num_cached_free_blocks", 0)),
        num_requests_waiting=int(m.get("num_requests_waiting", 0)),
        num_requests_running=int(m.get("num_requests_running", 0)),
        num_requests_preempted=int(m.get("num_requests_preempted", 0)))


def paged_rows(history: Sequence[dict[str, Any]], num_blocks: int,
               block_size: int) -> list[baseline.BaselineStep]:
    """The paged run's rows from its metrics (``baseline.paged_step`` of each step's
    pool summary, as ``baseline.paged_steps`` does after a replay), without a replay."""
    summaries = (summary_from_metrics(m, num_blocks, block_size) for m in history)
    return [baseline.paged_step(s) for s in summaries if s is not None]


def baselines(schedule: baseline.Schedule, history: Sequence[dict[str, Any]], num_blocks: int,
              block_size: int, max_model_len: int) -> Baselines:
    """Replay ``schedule`` on both contiguous variants; ``history``: the metrics of the
    same steps (the paged rows)."""
    cap = num_blocks * block_size
    results = {v.value: baseline.simulate(schedule.requests,
                                          baseline.BaselineConfig(cap, max_model_len, v),
                                          schedule.last_step)
               for v in baseline.Reservation}
    return Baselines(cap, results, paged_rows(history, num_blocks, block_size),
                     schedule.last_step)


def baselines_of_records(records: Sequence[Any], num_blocks: int, block_size: int,
                         max_model_len: int,
                         max_tokens: Mapping[str, int | None] | None = None) -> Baselines:
    """``baselines`` of a run's StepRecords (their schedule and their metrics)."""
    return baselines(baseline.schedule_of(records, max_tokens), [r.metrics for r in records],
                     num_blocks, block_size, max_model_len)


def split_now(snapshot: PoolSnapshot, base: Baselines | None) -> list[dict[str, Any]]:
    """Token-slot split of the pool at the snapshot's step, paged and contiguous.

    Each row: variant label, slots per category (palette.MEMORY_COLORS keys),
    running and waiting requests."""
    bs, n = snapshot.block_size, snapshot.num_blocks
    pool = snapshot.summary()
    filled = pool.num_filled_slots
    internal = pool.num_used_blocks * bs - filled
    cached = pool.num_cached_free_blocks * bs
    rows = [{"variant": VARIANT_LABELS["paged"], "filled": filled,
             "internal fragmentation": internal, "cached": cached,
             "free": n * bs - filled - internal - cached,
             "running": pool.num_requests_running,
             "waiting": pool.num_requests_waiting + pool.num_requests_preempted}]
    if base is None:
        return rows
    for v in (baseline.Reservation.MAX_MODEL_LEN.value, baseline.Reservation.PROMPT_PLUS_MAX_TOKENS.value):
        r = base.row_at(v, snapshot.step)
        if r is None:
            continue
        rows.append({"variant": VARIANT_LABELS[v], "filled": r.used_slots,
                     "reserved, unused": r.reserved_unused_slots,
                     "stranded (external fragmentation)": r.stranded_free_slots,
                     "free": r.free_slots - r.stranded_free_slots,
                     "running": r.num_running, "waiting": r.num_waiting})
    return rows


def summary_table(base: Baselines) -> list[dict[str, Any]]:
    """Run-level rows for a table: how many fit, how much reserved memory held nothing."""
    out = []
    for v, s in base.summaries().items():
        out.append({
            "allocator": VARIANT_LABELS[v],
            "mean running requests": round(s["mean_concurrency"], 2),
            "max running requests": s["max_concurrency"],
            "steps to finish": s["num_steps"],
            "longest start delay (steps)": s.get("max_delay", 0),
            "reserved but unused (% of reserved slots)":
                round(100 * s["reserved_unused_fraction"], 1),
            "mean external fragmentation (%)": round(100 * s["mean_external_fragmentation"], 1),
            "steps blocked by fragmentation": s["steps_blocked_by_fragmentation"],
            "requests that never fit": s["num_rejected"],
        })
    return out


def summary_frame(base: Baselines) -> list[dict[str, Any]]:
    """``summary_table`` turned for display: one row per figure, one column per allocator
    (three narrow columns fit the page, where eight wide ones were cut off)."""
    rows = summary_table(base)
    figures = [k for k in rows[0] if k != "allocator"] if rows else []
    return [{"figure": f, **{r["allocator"]: r[f] for r in rows}} for f in figures]

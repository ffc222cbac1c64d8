"""Paged vs contiguous: the same requests on a contiguous allocator (what-if figures).

The simulation itself is ``engine.events.baseline`` (same arrivals, same pool
capacity in token slots); this module only lines its rows up with the paged
run's step for the side-by-side bars and tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events import baseline as B

VARIANT_LABELS = {
    "paged": "paged (this engine)",
    B.Reservation.MAX_MODEL_LEN.value: "contiguous, reserve max_model_len",
    B.Reservation.PROMPT_PLUS_MAX_TOKENS.value: "contiguous, reserve prompt + max_tokens",
}


@dataclass(frozen=True, slots=True)
class Baselines:
    """Both contiguous variants of one run, plus the paged rows on the same scale."""

    capacity: int
    results: dict[str, B.BaselineResult]  # variant value → simulation
    paged: list[B.BaselineStep]

    def row_at(self, variant: str, step: int) -> B.BaselineStep | None:
        """The variant's row for ``step`` (the latest at or before it)."""
        rows = self.paged if variant == "paged" else self.results[variant].steps
        best = None
        for r in rows:
            if r.step > step:
                break
            best = r
        return best

    def summaries(self) -> dict[str, dict[str, Any]]:
        out = {"paged": {**B.summarize(self.paged, self.capacity), "variant": "paged",
                         "capacity": self.capacity, "num_rejected": 0}}
        for v, res in self.results.items():
            out[v] = res.summary()
        return out


def paged_rows(history: Sequence[dict[str, Any]], num_blocks: int,
               block_size: int) -> list[B.BaselineStep]:
    """The paged run's rows from its metrics (same definitions as ``baseline.paged_steps``:
    reserved = slots of referenced blocks, used = their filled slots), without a replay."""
    cap = num_blocks * block_size
    rows = []
    for m in history:
        used_blocks = m.get("num_used_blocks")
        if used_blocks is None or m.get("step") is None:
            continue
        reserved = used_blocks * block_size
        used = round((m.get("kv_token_usage") or 0.0) * cap)
        free = cap - reserved
        rows.append(B.BaselineStep(
            step=int(m["step"]), num_running=int(m.get("num_requests_running", 0)),
            num_waiting=int(m.get("num_requests_waiting", 0)) +
            int(m.get("num_requests_preempted", 0)),
            used_slots=used, reserved_slots=reserved, reserved_unused_slots=reserved - used,
            free_slots=free, largest_free_run=free, external_fragmentation=0.0,
            blocked_by_fragmentation=False, stranded_free_slots=0))
    return rows


def baselines(records: Sequence[Any], history: Sequence[dict[str, Any]], num_blocks: int,
              block_size: int, max_model_len: int,
              max_tokens: Mapping[str, int | None] | None = None) -> Baselines:
    """Simulate both contiguous variants over the run's arrivals (StepRecords)."""
    cap = num_blocks * block_size
    trace = B.trace_from_records(records, max_tokens)
    results = {v.value: B.simulate(trace, B.BaselineConfig(cap, max_model_len, v))
               for v in B.Reservation}
    return Baselines(cap, results, paged_rows(history, num_blocks, block_size))


def split_now(snapshot: dict[str, Any], base: Baselines | None) -> list[dict[str, Any]]:
    """Token-slot split of the pool at the snapshot's step, paged and contiguous.

    Each row: variant label, slots per category (palette.MEMORY_COLORS keys),
    running and waiting requests."""
    bs, n = snapshot["block_size"], snapshot["num_blocks"]
    filled = internal = cached = 0
    for b in snapshot["blocks"]:
        if b["ref_count"] > 0:
            filled += b["num_tokens"]
            internal += bs - b["num_tokens"]
        elif b["hash"] is not None:
            cached += bs
    statuses = [r["status"] for r in snapshot["requests"].values()]
    rows = [{"variant": VARIANT_LABELS["paged"], "filled": filled,
             "internal fragmentation": internal, "cached": cached,
             "free": n * bs - filled - internal - cached,
             "running": statuses.count("running"),
             "waiting": len(statuses) - statuses.count("running")}]
    if base is None:
        return rows
    for v in (B.Reservation.MAX_MODEL_LEN.value, B.Reservation.PROMPT_PLUS_MAX_TOKENS.value):
        r = base.row_at(v, snapshot["step"])
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
            "reserved but unused (% of reserved slots)":
                round(100 * s["reserved_unused_fraction"], 1),
            "mean external fragmentation (%)": round(100 * s["mean_external_fragmentation"], 1),
            "steps blocked by fragmentation": s["steps_blocked_by_fragmentation"],
            "requests that never fit": s["num_rejected"],
        })
    return out

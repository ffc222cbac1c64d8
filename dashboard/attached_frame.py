"""AttachedFrame: everything the Attached view draws, from a live attach or a stored run.

The attach-mode twin of ``RunFrame``: Live fills it from the websocket client's folded
``HashCacheSnapshot``, Replay from stored steps folded by the same hash-only reducer,
so ``attached_view.render_attached_view`` draws either. Also the tables the view's
charts read, built from the run's step records:

- ``pod_series``: per step and pod, cached / stored / removed blocks (from the
  metrics each step carries) and the scraped figures;
- ``rates``: stored and removed blocks per second, per pod;
- ``residency``: block lifetimes, idle-before-evict and reuse gaps, by folding the
  records once more with a ``ResidencyLog`` (``engine.events.metrics.residency``);
- ``fleet_rows``: each pod's latest fleet row (fidelity, churn) as the attach worker put
  it in the steps (``engine.attach.fleet``), with its latest scraped figures;
- ``ledger``: the records folded by ``engine.attach.ledger.FleetLedger``: what left each
  pod's cache and when, which the prefix locator needs to say "evicted at t".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from engine.attach.ledger import FleetLedger
from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.folds.hash_cache_state import HashCacheState
from engine.events.metrics.residency import ResidencyLog
from engine.events.schema.step import StepRecord
from engine.events.schema.types import Event

SCRAPED = ("kv_cache_usage", "prefix_cache_hit_rate", "prefix_cache_hit_rate_recent",
           "num_requests_running", "num_requests_waiting", "num_preemptions", "ttft_p50_s",
           "ttft_p90_s", "ttft_mean_s")


@dataclass(slots=True)
class AttachedFrame:
    source: str  # "live" | "replay"
    key: str  # the run id, for caches
    snapshot: HashCacheSnapshot
    events: Sequence[Event]  # the shown step's
    records: Sequence[StepRecord]  # the run's steps so far (replay: all of them)
    config: dict[str, Any]
    token_text: Callable[[list[int]], str] | None = None
    upto: int | None = None  # replay: the index of the shown record
    metrics: dict[str, Any] = field(default_factory=dict)  # the shown step's

    @property
    def step(self) -> int:
        return self.snapshot.step

    @property
    def tokenizer_file(self) -> str | None:
        return self.config.get("tokenizer_file")

    def pods(self) -> list[str]:
        """The pods in the order ``kvscope attach`` was given them (then any others)."""
        given = [p.get("pod") for p in self.config.get("pods") or []]
        return [p for p in given if p in self.snapshot.pods] + [
            p for p in self.snapshot.pods if p not in given]

    @property
    def shown_records(self) -> Sequence[StepRecord]:
        return self.records if self.upto is None else self.records[:self.upto + 1]


def pod_series(records: Sequence[StepRecord]) -> pd.DataFrame:
    """Long table: one row per (step, pod) with block counts and scraped figures."""
    rows = []
    t0 = records[0].ts if records else 0.0
    for r in records:
        m = r.metrics
        cached = m.get("cached_blocks") or {}
        scraped = m.get("scraped") or {}
        for pod in set(cached) | set(scraped):
            row: dict[str, Any] = {"step": r.step, "t": r.ts - t0, "pod": pod,
                                   "cached_blocks": cached.get(pod),
                                   "stored_blocks": (m.get("stored_blocks") or {}).get(pod),
                                   "removed_blocks": (m.get("removed_blocks") or {}).get(pod)}
            figures = scraped.get(pod) or {}
            for k in SCRAPED:
                row[k] = figures.get(k)
            rows.append(row)
    cols = ["step", "t", "pod", "cached_blocks", "stored_blocks", "removed_blocks", *SCRAPED]
    df = pd.DataFrame(rows, columns=cols)
    for c in cols[3:]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def rates(series: pd.DataFrame, bucket_s: float = 1.0) -> pd.DataFrame:
    """Stored and removed blocks per second, per pod, in ``bucket_s`` buckets of run time."""
    cols = ["t", "pod", "stored_per_s", "removed_per_s"]
    if series.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for pod, g in series.sort_values("step").groupby("pod", sort=False):
        g = g.dropna(subset=["stored_blocks", "removed_blocks"])
        if g.empty:
            continue
        d = g[["stored_blocks", "removed_blocks"]].diff().fillna(g[["stored_blocks", "removed_blocks"]])
        d = d.clip(lower=0)  # a restart empties the counters' base, not the past
        b = (g["t"] // bucket_s) * bucket_s
        per = d.groupby(b).sum() / bucket_s
        for t, row in per.iterrows():
            out.append({"t": t, "pod": pod, "stored_per_s": row["stored_blocks"],
                        "removed_per_s": row["removed_blocks"]})
    return pd.DataFrame(out, columns=cols)


def residency(records: Sequence[StepRecord]) -> ResidencyLog:
    """Lifetimes, idle-before-evict, reuse and recompute gaps of the run so far."""
    log = ResidencyLog()
    state = HashCacheState(residency=log)
    for r in records:
        state.apply_step(r)
    return log


def ledger(records: Sequence[StepRecord]) -> FleetLedger:
    """The run so far folded by the attach worker's own ledger (removals, churn)."""
    led = FleetLedger()
    for r in records:
        led.apply_step(r)
    return led


def fleet_rows(frame: AttachedFrame) -> dict[str, dict[str, Any]]:
    """Per pod (``frame.pods()`` order, then any pod only the rows name), the latest fleet row
    at the shown step, with ``scraped`` (its latest /metrics figures) added."""
    rows: dict[str, dict[str, Any]] = {}
    scraped: dict[str, dict[str, Any]] = {}
    for r in reversed(frame.shown_records):
        for pod, row in (r.metrics.get("fleet") or {}).items():
            rows.setdefault(pod, row)
        for pod, fig in (r.metrics.get("scraped") or {}).items():
            scraped.setdefault(pod, fig)
        if len(rows) >= len(frame.config.get("pods") or ()) and rows:
            break
    given = [p.get("pod") for p in frame.config.get("pods") or []]
    order = [p for p in given if p in rows] + [p for p in rows if p not in given]
    return {p: {**rows[p], "scraped": scraped.get(p) or {}} for p in order}

"""Stored runs for Replay and Compare: loaded once, folded by the shared reducer.

A run's StepRecords are loaded once per (database, run, step count) and kept in
``st.cache_resource``; the pool state at any step is folded from the nearest
checkpoint (every ``CHECKPOINT_EVERY`` steps), so scrubbing and playing stay
cheap on long runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from engine.events.baseline.schedule_trace import Schedule, schedule_of
from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.folds.run_kind import AnyState, RunKind, empty_state
from engine.events.schema.step import StepRecord
from engine.events.schema.types import (
    BlockEvicted, CowCopy, KVAllCleared, KVBlockRemoved, KVGap, KVSegment, RequestPreempted,
)
from engine.store.runs import RunStore

from dashboard.attached_frame import AttachedFrame
from dashboard.frame import RunFrame
from dashboard.token_text import token_text_for

CHECKPOINT_EVERY = 32  # folds at most 32 steps per frame; a checkpoint costs one PoolState copy

JUMPS = {  # "jump to next …" targets: event type that marks a step
    "eviction": BlockEvicted,
    "preemption": RequestPreempted,
    "CoW copy": CowCopy,  # copy-on-write
}
ATTACHED_JUMPS = {  # the same for an attached run's hash-only events
    "removal": KVBlockRemoved,
    "hole": KVGap,
    "restart or clear": (KVSegment, KVAllCleared),
}


@dataclass(slots=True)
class StoredRun:
    """One run's rows, records and fold checkpoints (shared read-only across sessions)."""

    run: dict[str, Any]
    records: list[StepRecord]
    requests: list[dict[str, Any]]
    _checkpoints: dict[int, AnyState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _schedule: Schedule | None = None

    @property
    def config(self) -> dict[str, Any]:
        return self.run.get("config") or {}

    @property
    def kind(self) -> RunKind:
        return RunKind.of(self.run.get("kind"))

    @property
    def jumps(self) -> dict[str, Any]:
        return ATTACHED_JUMPS if self.kind is RunKind.ATTACHED else JUMPS

    @property
    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    @property
    def max_tokens(self) -> dict[str, int | None]:
        out = {}
        for q in self.requests:
            params = q.get("params") or {}
            out[q["request_id"]] = params.get("max_tokens")
        return out

    @property
    def schedule(self) -> Schedule:
        """The whole run's schedule (the contiguous baseline's input), read once."""
        with self._lock:
            if self._schedule is None:
                self._schedule = schedule_of(self.records, self.max_tokens)
            return self._schedule

    def state_after(self, index: int) -> AnyState:
        """The folded state after ``records[index]`` (a fresh copy the caller may keep): the
        pool of an engine run, the hash cache of an attached one."""
        if not 0 <= index < len(self.records):
            raise IndexError(f"run {self.run['id']} has {len(self.records)} steps, not {index + 1}")
        base = (index // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
        with self._lock:
            start = max((c for c in self._checkpoints if c <= base), default=None)
            if start is None:
                state = empty_state(self.kind, self.config)
                start = -1
            else:
                state = self._checkpoints[start].copy()
            for i in range(start + 1, index + 1):
                state.apply_step(self.records[i])
                if i % CHECKPOINT_EVERY == 0 and i not in self._checkpoints:
                    self._checkpoints[i] = state.copy()
        return state

    def frame(self, index: int) -> RunFrame | AttachedFrame:
        """The frame after step ``records[index]`` (history up to it): a RunFrame, or an
        AttachedFrame for an attached run."""
        state = self.state_after(index)
        rec = self.records[index]
        state.step = rec.step
        snap = state.to_snapshot()
        if isinstance(snap, HashCacheSnapshot):
            return AttachedFrame("replay", self.run["id"], snap, rec.events, self.records,
                                 self.config, token_text_for(self.config), index, rec.metrics)
        return RunFrame(source="replay", key=self.run["id"], snapshot=snap, events=rec.events,
                        history=[r.metrics for r in self.records[:index + 1]],
                        config=self.config, schedule=self.schedule,
                        schedule_history=[r.metrics for r in self.records],
                        token_text=token_text_for(self.config))

    def next_index(self, index: int, kind: str, backwards: bool = False) -> int | None:
        """The next (or previous) record index whose events include ``kind``."""
        cls = self.jumps[kind]
        rng = range(index - 1, -1, -1) if backwards else range(index + 1, len(self.records))
        for i in rng:
            if any(isinstance(e, cls) for e in self.records[i].events):
                return i
        return None


@st.cache_resource(max_entries=8, show_spinner="Loading the run's steps…")
def _load(db_path: str, run_id: str, num_steps: int) -> StoredRun:
    # num_steps is part of the key: a run still being recorded reloads as it grows.
    store = RunStore(db_path)
    return StoredRun(store.get_run(run_id), store.load_steps(run_id),
                     store.load_requests(run_id))


def load_run(store: RunStore, run: dict[str, Any]) -> StoredRun:
    """The cached StoredRun for a row of ``store.list_runs()``."""
    return _load(store.path, run["id"], int(run.get("num_steps") or 0))


def run_label(run: dict[str, Any]) -> str:
    """'label · 2025-01-01 12:00 · 64×16 · 120 steps' for pickers."""
    import time as _t

    cfg = run.get("config") or {}
    when = _t.strftime("%Y-%m-%d %H:%M:%S", _t.localtime(run.get("started_at") or 0))
    name = run.get("label") or run["id"]
    if run.get("kind") == RunKind.ATTACHED:
        pods = ", ".join(p.get("pod", "?") for p in cfg.get("pods") or [])
        return f"{name} · {when} · attached to {pods} · {run.get('num_steps', 0)} steps"
    return (f"{name} · {when} · {cfg.get('num_blocks', '?')}×{cfg.get('block_size', '?')} "
            f"blocks · {run.get('num_steps', 0)} steps · {run.get('num_requests', 0)} requests")

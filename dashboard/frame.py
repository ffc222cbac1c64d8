"""RunFrame: everything the shared run view draws, from Live or from Replay.

Live fills it from the websocket client's folded state, Replay from stored
steps folded by the same reducer; ``panels.render_run_view`` draws either, so
the two pages cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events.baseline.schedule_trace import Schedule
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.schema.types import Event


@dataclass(slots=True)
class RunFrame:
    """One moment of one run: every part is of the same step. ``snapshot`` is the pool
    after ``events`` (the step's), ``history`` the metrics dicts up to it, oldest
    first (the last one is the step's: ``consistent`` checks it).

    ``schedule``: the run's schedule for the contiguous baseline (Live: up to this
    step; Replay: the whole run), with ``schedule_history`` the metrics of the steps
    it covers (default ``history``); None where unavailable. ``key``: identifies the
    run for caches (run id)."""

    source: str  # "live" | "replay"
    key: str
    snapshot: PoolSnapshot
    events: Sequence[Event]
    history: Sequence[dict[str, Any]]
    config: dict[str, Any]
    schedule: Schedule | None = None
    schedule_history: Sequence[dict[str, Any]] | None = None
    token_text: Callable[[list[int]], str] | None = None
    events_known: bool = True  # False: the step's events never reached this client

    @property
    def step(self) -> int:
        return self.snapshot.step

    @property
    def metrics(self) -> dict[str, Any]:
        """The shown step's metrics ({} before the first step)."""
        return dict(self.history[-1]) if self.history else {}

    @property
    def consistent(self) -> bool:
        """Whether the metrics, the events and the schedule are all of the pool's step."""
        m = self.history[-1] if self.history else None
        if m is not None and m.get("step") != self.step:
            return False
        if any(e.step != self.step for e in self.events):
            return False
        if self.source == "live" and self.schedule is not None and self.history:
            return self.schedule.last_step == self.step
        return True

    @property
    def max_model_len(self) -> int:
        """The engine's max_model_len; the pool capacity when the config lacks it."""
        v = self.config.get("max_model_len")
        if isinstance(v, int) and v > 0:
            return v
        return self.snapshot.num_blocks * self.snapshot.block_size

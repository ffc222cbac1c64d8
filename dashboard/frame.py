"""RunFrame: everything the shared run view draws, from Live or from Replay.

Live fills it from the websocket client's folded state, Replay from stored
steps folded by the same reducer; ``panels.render_run_view`` draws either, so
the two pages cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.events.pool_snapshot import PoolSnapshot
from engine.events.types import Event


@dataclass(slots=True)
class RunFrame:
    """One moment of one run. ``snapshot`` is the pool after ``events`` (the step's).

    ``history``: metrics dicts up to this step, oldest first. ``records``: the
    StepRecords seen so far (for the contiguous baseline; None where unavailable).
    ``max_tokens``: request id → its max_tokens parameter (baseline reservations).
    ``key``: identifies the run for caches (run id)."""

    source: str  # "live" | "replay"
    key: str
    snapshot: PoolSnapshot
    events: Sequence[Event]
    history: Sequence[dict[str, Any]]
    config: dict[str, Any]
    records: Sequence[Any] | None = None
    max_tokens: dict[str, int | None] = field(default_factory=dict)
    token_text: Callable[[list[int]], str] | None = None

    @property
    def step(self) -> int:
        return self.snapshot.step

    @property
    def max_model_len(self) -> int:
        """The engine's max_model_len; the pool capacity when the config lacks it."""
        v = self.config.get("max_model_len")
        if isinstance(v, int) and v > 0:
            return v
        return self.snapshot.num_blocks * self.snapshot.block_size

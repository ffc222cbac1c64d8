"""The state reducer: folds protocol events into the pool snapshot.

One code path for live view and replay: the dashboard and ``snapshot_at`` fold
the same events with ``PoolState``. After every step the folded state must equal
``scheduler.snapshot()``; an event that cannot happen in the folded state (a
drift between engine and reducer) raises ``ImpossibleEventError`` at once.

This module is the public entry point: it re-exports ``PoolState``
(``engine.events.pool_state``) and ``ImpossibleEventError``
(``engine.events.rules``, with the per-event rules) and adds the pure API over
``PoolSnapshot`` (``engine.events.pool_snapshot``, which states the JSON shape).

Writer: ``PoolState`` is written only by ``apply_event``; ``apply``/``replay``
are pure wrappers over it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.events.pool_snapshot import PoolSnapshot
from engine.events.pool_state import PoolState
from engine.events.rules import ImpossibleEventError
from engine.events.types import Event

__all__ = ["ImpossibleEventError", "PoolSnapshot", "PoolState", "apply", "empty_state",
           "replay"]


def empty_state(num_blocks: int, block_size: int) -> PoolSnapshot:
    """Snapshot of an empty pool: all blocks free, hashless, queued in id order."""
    return PoolState(num_blocks, block_size).to_snapshot()


def apply(state: PoolSnapshot, event: Event | dict[str, Any]) -> PoolSnapshot:
    """Pure: the snapshot after ``event`` (snapshots are immutable). O(state) per call,
    so fold many events with ``replay`` or a ``PoolState``."""
    s = PoolState.from_snapshot(state)
    s.apply_event(event)
    return s.to_snapshot()


def replay(snapshot_or_empty: PoolSnapshot, events: Iterable[Event | dict[str, Any]],
           step: int | None = None) -> PoolSnapshot:
    """Pure: fold ``events`` onto a snapshot; ``step`` overrides the result's step."""
    s = PoolState.from_snapshot(snapshot_or_empty)
    s.apply_events(events)
    if step is not None:
        s.step = step
    return s.to_snapshot()

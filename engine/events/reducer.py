"""The state reducer: folds protocol events into the pool snapshot.

One code path for live view and replay: the dashboard and ``snapshot_at`` fold
the same events with ``PoolState``. After every step the folded state must equal
``scheduler.snapshot()``; an event that cannot happen in the folded state (a
drift between engine and reducer) raises ``ImpossibleEventError`` at once.

This module is the public entry point: it re-exports ``PoolState``
(``engine.events.pool_state``) and ``ImpossibleEventError``
(``engine.events.rules``, with the per-event rules) and adds the pure API.

Snapshot shape (JSON-able)::

    {"step", "block_size", "num_blocks",
     "blocks": [{"id", "ref_count", "hash", "num_tokens", "token_ids"}],  # by id
     "free_queue": [ids, head (reused next) first],
     "requests": {rid: {"status", "block_table", "num_tokens", "num_computed_tokens",
                        "num_cached_tokens", "token_ids", "parent_id", "arrival_index"}}}

Writer: ``PoolState`` is written only by ``apply_event``; ``apply``/``replay``
are pure wrappers over it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.events import types as T
from engine.events.pool_state import PoolState
from engine.events.rules import ImpossibleEventError

__all__ = ["ImpossibleEventError", "PoolState", "apply", "empty_state", "replay"]


def empty_state(num_blocks: int, block_size: int) -> dict[str, Any]:
    """Snapshot of an empty pool: all blocks free, hashless, queued in id order."""
    return PoolState(num_blocks, block_size).to_snapshot()


def apply(state: dict[str, Any], event: T.Event | dict[str, Any]) -> dict[str, Any]:
    """Pure: the snapshot after ``event``; ``state`` is not mutated. O(state) per call,
    so fold many events with ``replay`` or a ``PoolState``."""
    s = PoolState.from_snapshot(state)
    s.apply_event(event)
    return s.to_snapshot()


def replay(snapshot_or_empty: dict[str, Any], events: Iterable[T.Event | dict[str, Any]],
           step: int | None = None) -> dict[str, Any]:
    """Pure: fold ``events`` onto a snapshot; ``step`` overrides the result's step."""
    s = PoolState.from_snapshot(snapshot_or_empty)
    s.apply_events(events)
    if step is not None:
        s.step = step
    return s.to_snapshot()

"""The state reducer: folds protocol events into the pool snapshot.

One code path for live view and replay: the dashboard and ``snapshot_at`` fold
the same events with ``PoolState``. After every step the folded state must equal
``scheduler.snapshot()``; an event that cannot happen in the folded state (a
drift between engine and reducer) raises ``ImpossibleEventError`` at once.

This module is the public entry point: it re-exports ``PoolState``
(``engine.events.folds.pool_state``) and ``ImpossibleEventError``
(``engine.events.folds.rules``, with the per-event rules) and ``PoolSnapshot``
(``engine.events.folds.pool_snapshot``, which states the JSON shape).

Writer: ``PoolState`` is written only by ``apply_event``.
"""

from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.pool_state import PoolState
from engine.events.folds.rules import ImpossibleEventError

__all__ = ["ImpossibleEventError", "PoolSnapshot", "PoolState"]

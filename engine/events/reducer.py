"""The state reducer: folds protocol events into the pool snapshot.

One code path for live view and replay: the dashboard and ``snapshot_at`` fold
the same events with ``PoolState``. After every step the folded state must equal
``scheduler.snapshot()``; an event that cannot happen in the folded state (a
drift between engine and reducer) raises ``ImpossibleEventError`` at once.

This module is the public entry point: it re-exports ``PoolState``
(``engine.events.pool_state``) and ``ImpossibleEventError``
(``engine.events.rules``, with the per-event rules).

Snapshot shape (JSON-able)::

    {"step", "block_size", "num_blocks",
     "blocks": [{"id", "ref_count", "hash", "num_tokens", "token_ids"}],  # by id
     "free_queue": [ids, head (reused next) first],
     "requests": {rid: {"status", "block_table", "num_tokens", "num_computed_tokens",
                        "num_cached_tokens", "token_ids", "parent_id", "arrival_index"}}}

Writer: ``PoolState`` is written only by ``apply_event``.
"""

from engine.events.pool_state import PoolState
from engine.events.rules import ImpossibleEventError

__all__ = ["ImpossibleEventError", "PoolState"]

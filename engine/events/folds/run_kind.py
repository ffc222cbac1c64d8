"""RunKind: what a run recorded, and the fold that replays each kind.

- ``engine``: kvscope's own engine; ``PoolState`` folds its events into a
  ``PoolSnapshot`` (block ids, ref counts, tables).
- ``attached``: ``kvscope attach`` on a foreign engine's hash-only KV event stream;
  ``HashCacheState`` folds its ``kv_*`` events into a ``HashCacheSnapshot``.
- ``simulated``: one pod of ``kvscope simulate``: the real core's events without a
  model, folded as an engine run's.

The store, the live client and the dashboard ask here instead of branching on
strings, so a new kind is added in one place. A run recorded before kinds existed
has none and is an engine run.
"""

from __future__ import annotations

import enum
from typing import Any, Union

from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.folds.hash_cache_state import HashCacheState
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.pool_state import PoolState

AnySnapshot = Union[PoolSnapshot, HashCacheSnapshot]
AnyState = Union[PoolState, HashCacheState]


class RunKind(enum.StrEnum):
    ENGINE = "engine"
    ATTACHED = "attached"
    SIMULATED = "simulated"

    @classmethod
    def of(cls, value: Any) -> RunKind:
        """The kind stored for a run (None: recorded before kinds, an engine run)."""
        if value is None:
            return cls.ENGINE
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown run kind {value!r} (known: {', '.join(k.value for k in cls)})") from None


def empty_state(kind: RunKind | str | None, config: dict[str, Any]) -> AnyState:
    """The state a run of ``kind`` folds from (an engine run needs its pool shape)."""
    if RunKind.of(kind) is RunKind.ATTACHED:
        return HashCacheState()
    try:
        return PoolState(int(config["num_blocks"]), int(config["block_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError("an engine run's config needs num_blocks and block_size to be "
                         "replayed") from exc


def snapshot_from_dict(d: dict[str, Any]) -> AnySnapshot:
    """The snapshot a JSON object describes: a hash cache (``kind``) or a pool."""
    if isinstance(d, dict) and d.get("kind") == HashCacheSnapshot.KIND:
        return HashCacheSnapshot.from_dict(d)
    return PoolSnapshot.from_dict(d)


def state_from_snapshot(snap: AnySnapshot) -> AnyState:
    """A fold that continues from ``snap``."""
    if isinstance(snap, HashCacheSnapshot):
        return HashCacheState.from_snapshot(snap)
    return PoolState.from_snapshot(snap)

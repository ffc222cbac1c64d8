"""Reading protocol v1 step bodies (runs recorded before v2) as v2 events.

v1 differed in two ways the reducer cares about (``engine.events.schema.types`` states v2):
- a copy-on-write was a ``block_freed`` of src (its new ref count) followed by a
  ``cow_copy`` without ``src_ref_count``; v2 has one self-contained ``cow_copy``;
- ``block_evicted`` had no ``reason``. A v1 engine emitted a reset's evictions
  right before its ``prefix_cache_reset``, so those become ``reset``; every other
  one becomes ``reuse``. A v1 rollback eviction cannot be told from a reuse one
  (v1's metrics counted it as an eviction too, so the stored metrics agree).

A v1 ``prefix_lookup`` reads as a first admission (``resumed`` false), as v1
counted it. Pure functions over the JSON dicts; the decoder (``StepRecord``)
calls ``upgrade_events`` on every step body, and v2 bodies pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def is_v1(events: Sequence[dict[str, Any]]) -> bool:
    """True when the body holds an event only v1 wrote."""
    return any((e.get("type") == "cow_copy" and "src_ref_count" not in e)
               or (e.get("type") == "block_evicted" and "reason" not in e) for e in events)


def upgrade_events(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """v2 dicts for one step's event dicts (a v2 body is returned as is)."""
    if not is_v1(events):
        return list(events)
    out: list[dict[str, Any]] = []
    for e in events:
        kind = e.get("type")
        if kind == "cow_copy" and "src_ref_count" not in e:
            prev = out[-1] if out else None
            if not (prev and prev.get("type") == "block_freed" and prev.get("block") == e.get("src")
                    and prev.get("request_id") == e.get("request_id")):
                raise ValueError(f"a v1 cow_copy of {e.get('request_id')!r} (src {e.get('src')}) "
                                 f"without the block_freed of its src before it cannot be upgraded")
            out[-1] = {**e, "src_ref_count": prev["ref_count"]}
        elif kind == "prefix_cache_reset":
            i = len(out)
            while i and out[i - 1].get("type") == "block_evicted" and "reason" not in out[i - 1]:
                i -= 1
                out[i] = {**out[i], "reason": "reset"}
            out.append(e)
        else:
            out.append(e)
    return [{**e, "reason": "reuse"} if e.get("type") == "block_evicted" and "reason" not in e
            else e for e in out]

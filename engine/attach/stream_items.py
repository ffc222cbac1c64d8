"""What a pod's subscription hands the attach worker, in the order it happened.

- ``Received``: one decoded batch (live, or returned by replay);
- ``Hole``: batches that never arrived and replay could not return (or that arrived
  but could not be decoded): the pod's record has a visible gap there;
- ``NewSegment``: the pod's stream begins (the first batch) or began again (the
  publisher restarted; its cache is empty).

Each becomes one step of the attached run (``engine.attach.worker``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from engine.kv_events.types import KVEventBatch


@dataclass(frozen=True, slots=True)
class Received:
    pod: str
    segment: int
    seq: int
    batch: KVEventBatch
    replayed: bool = False
    fill: str = "live"  # live | history (replayed at the attach) | gap (replayed to fill one) | tail
    wire: dict[str, Any] | None = None  # its dialect (engine.attach.wire.dialect)


@dataclass(frozen=True, slots=True)
class Hole:
    pod: str
    segment: int
    first_seq: int
    last_seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class NewSegment:
    pod: str
    segment: int
    first_seq: int
    reason: str  # "attach" | "restart"


StreamItem = Union[Received, Hole, NewSegment]

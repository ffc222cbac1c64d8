"""The list a step's events are written into (shared by scheduler, manager, pool),
and the engine-lifetime counts of every event written (``EventCounts``).

Writer: the core's mutators call ``add``; the engine drains the list once per step.
The counts are kept even when events are not (``enabled=False``, for benchmarks),
so ``LLMEngine.stats()`` is right either way.
"""

from __future__ import annotations

from engine.events.metrics.event_counts import EventCounts
from engine.events.schema.types import Event


class EventLog:
    """Collects events; ``step`` is the engine step the events belong to."""

    __slots__ = ("step", "events", "enabled", "counts")

    def __init__(self, enabled: bool = True) -> None:
        self.step = 1
        self.events: list[Event] = []
        self.enabled = enabled
        self.counts = EventCounts()

    def add(self, event: Event) -> None:
        self.counts.add(event)
        if self.enabled:
            self.events.append(event)

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out

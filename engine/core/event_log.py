"""The list a step's events are written into (shared by scheduler, manager, pool)."""

from __future__ import annotations

from engine.events.types import Event


class EventLog:
    """Collects events; ``step`` is the engine step the events belong to."""

    __slots__ = ("step", "events", "enabled")

    def __init__(self, enabled: bool = True) -> None:
        self.step = 1
        self.events: list[Event] = []
        self.enabled = enabled

    def add(self, event: Event) -> None:
        if self.enabled:
            self.events.append(event)

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out

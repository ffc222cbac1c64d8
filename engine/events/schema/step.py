"""StepRecord: one engine step as published and stored.

It is the body of the ``step`` server message and one row of the ``steps``
table. Writer: the engine builds one per step after ``update``; everything else
(server, recorder, dashboard, replay) only reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.events.schema.json_text import compact
from engine.events.schema.legacy import upgrade_events
from engine.events.schema.types import Event, event_from_dict


@dataclass(slots=True)
class StepRecord:
    """``seq`` counts step messages (+1 each, gaps mean loss); ``step`` is the engine
    step number the events carry; ``ts`` is wall-clock seconds (time.time()) at the
    end of the step; ``metrics`` is the dict from ``MetricsTracker.update``."""

    seq: int
    step: int
    ts: float
    events: list[Event] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    # (events, metrics) as JSON text, written by the first reader that asks (json_parts)
    _json: tuple[str, str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.seq, int) or self.seq < 0:
            raise ValueError(f"seq must be an integer >= 0, got {self.seq!r}")
        if not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"step must be an integer >= 0, got {self.step!r}")
        # Events may still be dicts (decoded JSON, or built by hand); normalise once
        # here so every reader sees typed v2 events (v1 bodies are upgraded).
        if not all(isinstance(e, Event) for e in self.events):
            dicts = [e.to_dict() if isinstance(e, Event) else e for e in self.events]
            self.events = [event_from_dict(e) for e in upgrade_events(dicts)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: events as their ``to_dict`` form."""
        return {
            "seq": self.seq,
            "step": self.step,
            "ts": self.ts,
            "events": [e.to_dict() for e in self.events],
            "metrics": dict(self.metrics),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        """Inverse of ``to_dict``; raises ValueError on unknown event types."""
        return cls(
            seq=int(d["seq"]),
            step=int(d["step"]),
            ts=float(d["ts"]),
            events=list(d.get("events", ())),
            metrics=dict(d.get("metrics") or {}),
        )

    def json_parts(self) -> tuple[str, str]:
        """(events, metrics) as compact JSON text (``engine.events.schema.json_text``), written
        once and shared by every reader: the step frame every watcher gets and the
        recorder's row. A record is not changed after it is published (its writer is the
        engine, before it publishes); a redacted copy is a new record."""
        parts = self._json
        if parts is None:
            events = "[" + ",".join(e.to_json() for e in self.events) + "]"
            parts = self._json = (events, compact(self.metrics))
        return parts

    def to_json(self, head: str = "{") -> str:
        """``to_dict()`` as compact JSON text (``head`` opens the object: a message
        puts its type there)."""
        events, metrics = self.json_parts()
        return (f'{head}"seq":{compact(self.seq)},"step":{compact(self.step)},'
                f'"ts":{compact(self.ts)},"events":{events},"metrics":{metrics}}}')

    @classmethod
    def from_json(cls, text: str) -> StepRecord:
        return cls.from_dict(json.loads(text))

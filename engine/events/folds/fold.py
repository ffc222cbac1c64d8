"""Fold: what every reducer state offers on top of its own ``apply_event``.

``PoolState`` (an engine run) and ``HashCacheState`` (an attached run) fold events
one at a time by their own rules; folding a list or a whole ``StepRecord`` is the
same for both, so it lives here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Fold:
    __slots__ = ()
    step: int

    def apply_event(self, event: Any) -> None:
        raise NotImplementedError

    def apply_events(self, events: Iterable[Any]) -> None:
        """Fold ``events`` in order, in place."""
        for e in events:
            self.apply_event(e)

    def apply_step(self, record: Any) -> None:
        """Fold a StepRecord's events; the state's step becomes the record's."""
        self.apply_events(record.events)
        self.step = record.step

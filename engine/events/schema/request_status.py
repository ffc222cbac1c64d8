"""A request's lifecycle: the one ``RequestStatus`` the core and the reducer share.

Defined here, below the core, so ``engine.core`` imports it and ``engine.events``
never imports the core. A ``StrEnum``: a status is its wire string (``"waiting"``),
so snapshots and events keep their JSON shape.

Writer of a live request's status: the Scheduler; of a folded one: the reducer's
event rules.
"""

from __future__ import annotations

import enum


class RequestStatus(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # lost its blocks; waits to be recomputed
    FINISHED_LENGTH = "finished_length"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """``"length" | "stop" | "abort"`` (the ``request_finished`` reason), else None."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {RequestStatus.FINISHED_LENGTH: "length",
                   RequestStatus.FINISHED_STOPPED: "stop",
                   RequestStatus.FINISHED_ABORTED: "abort"}

# Statuses a request in the pool can have (finished ones leave it).
LIVE_STATUSES = (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)

"""RecorderHealth: what the recorder can say about itself, and when that degrades a server.

``Recorder.health()`` returns one (from any thread); the server shows it in
``/healthz`` (``recorder_problem`` decides ``degraded``) and in ``/metrics``.
Counters are totals since the recorder started, so they only grow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# A healthy writer commits everything queued in one batch per wake-up, so its backlog
# stays near one batch (tens of steps). A thousand steps waiting is seconds of serving
# not yet on disk: the writer is starved or the database is slow.
BEHIND_STEPS = 1000


@dataclass(frozen=True, slots=True)
class RecorderHealth:
    alive: bool                 # the writer thread runs (False once closed, or if it died)
    backlog_steps: int          # steps queued or held for a retry, not yet committed
    errors_total: int           # failed write attempts, plus unexpected writer errors
    dropped_steps_total: int    # steps dropped because the backlog passed its bound
    dropped_requests_total: int  # finished requests' rows dropped the same way
    skipped_rows_total: int     # rows the database could never store (e.g. a lone surrogate)
    written_rows_total: int     # rows committed
    fault: str | None = None    # why writes fail right now; None while they succeed
    last_error: str | None = None  # the latest failure or skip, kept after recovery

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def recorder_problem(health: RecorderHealth, behind_steps: int = BEHIND_STEPS) -> str | None:
    """Why a server with this recorder is ``degraded`` (one line), or None if it is not.

    Down beats failing beats behind: each names what an operator should look at."""
    if not health.alive:
        why = f" (last error: {health.last_error})" if health.last_error else ""
        return f"recorder is down{why}: steps are no longer recorded"
    lost = (f", {health.dropped_steps_total} dropped so far" if health.dropped_steps_total else "")
    if health.fault is not None:
        return (f"recorder failing: {health.fault}; {health.backlog_steps} steps waiting{lost}; "
                f"serving continues")
    if health.backlog_steps > behind_steps:
        return (f"recorder behind: {health.backlog_steps} steps waiting to be written "
                f"(more than {behind_steps}){lost}")
    return None

"""Loss: the marker a run keeps where the recorder had to drop rows.

While the database fails, the recorder holds unsaved rows in a bounded backlog;
past the bound it drops the oldest and counts them in the run's open ``Loss``.
The marker is written with the next batch that commits, so the run itself says
"N steps lost here" (``kvscope replay`` and ``RunStore.losses`` show it) instead
of replaying a silently broken event stream.

Table ``losses`` (created by the recorder with the first marker, so databases that
never lost anything keep their old schema): id TEXT pk, run_id, first_seq,
last_seq, first_step, last_step (NULL when only requests were lost), num_steps,
num_requests, reason, ts (unix s of the first drop).

Writer: the recorder's writer thread, the only writer of the markers.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

TABLE = "losses"
SCHEMA = {"id": str, "run_id": str, "first_seq": int, "last_seq": int, "first_step": int,
          "last_step": int, "num_steps": int, "num_requests": int, "reason": str, "ts": float}


def ensure_table(db: Any) -> None:
    """Create the ``losses`` table and its run index if missing (inside the caller's transaction)."""
    db[TABLE].create(SCHEMA, pk="id", if_not_exists=True)
    db[TABLE].create_index(["run_id"], if_not_exists=True)


@dataclass(slots=True)
class Loss:
    """Rows of one run dropped in one fault episode (steps contiguous from ``first_seq``)."""

    run_id: str
    reason: str
    id: str = ""
    first_seq: int | None = None
    last_seq: int | None = None
    first_step: int | None = None
    last_step: int | None = None
    num_steps: int = 0
    num_requests: int = 0
    ts: float = 0.0

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.run_id}:{secrets.token_hex(6)}"
        self.ts = self.ts or time.time()

    def add_step(self, seq: int, step: int) -> None:
        """Count one dropped step (the backlog drops them oldest first, so in seq order)."""
        if self.first_seq is None:
            self.first_seq, self.first_step = seq, step
        self.last_seq, self.last_step = seq, step
        self.num_steps += 1

    def describe(self) -> str:
        """'12 steps lost here (steps 40..51)' and/or '3 requests lost', with the reason."""
        parts = []
        if self.num_steps:
            parts.append(f"{_n(self.num_steps, 'step')} lost here (steps {self.first_step}.."
                         f"{self.last_step}, seq {self.first_seq}..{self.last_seq})")
        if self.num_requests:
            parts.append(f"{_n(self.num_requests, 'finished request')}'s rows lost")
        return "; ".join(parts) + f": the recorder's backlog was full while {self.reason}"

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Loss:
        return cls(**{f.name: row.get(f.name) for f in fields(cls)})


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"

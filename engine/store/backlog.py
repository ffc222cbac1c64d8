"""Backlog: the recorder's prepared rows waiting for a commit, bounded, with loss markers.

Rows enter prepared (serialised and checked once, by the recorder); a retry writes
the same rows again, so a step is never re-serialised however long a fault lasts.
Bounds: ``max_rows`` data rows (runs + steps + requests) and ``max_bytes`` of their
text. Past a bound the oldest step rows go first; a run's request rows are its
record of what was served, so they go only when no step row is left. Each drop is
counted in its run's open ``Loss``, written with the next commit. Runs rows,
finish marks and loss markers are never dropped: there are a handful per run.

Writer: the recorder's writer thread only (not thread-safe); ``write`` is the only
writer of the rows it holds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from engine.store import db as dbm
from engine.store import loss as lossm
from engine.store.loss import Loss


@dataclass(frozen=True, slots=True)
class Row:
    table: str               # "runs" | "steps" | "requests"
    values: dict[str, Any]   # column -> value, ready to bind
    nbytes: int              # text size, for the byte bound


class Backlog:
    def __init__(self, max_rows: int, max_bytes: int) -> None:
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self._runs: list[Row] = []
        self._steps: deque[Row] = deque()
        self._requests: deque[Row] = deque()
        self._finishes: list[tuple[str, float]] = []
        self._losses: dict[str, Loss] = {}  # run id -> its open (uncommitted) marker
        self.nbytes = 0
        self.dropped_steps = 0     # totals since the recorder started
        self.dropped_requests = 0

    def __len__(self) -> int:
        """Data rows held (the ``max_rows`` count)."""
        return len(self._runs) + len(self._steps) + len(self._requests)

    def __bool__(self) -> bool:
        return bool(len(self) or self._finishes or self._losses)

    @property
    def full(self) -> bool:
        """One more row would drop the oldest."""
        return len(self) >= self.max_rows or self.nbytes >= self.max_bytes

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def add(self, row: Row, reason: str) -> list[Loss]:
        """Hold ``row``; drop the oldest past a bound. Returns the markers that drops
        opened (a caller logs a new episode once); ``reason`` says why rows wait."""
        {"runs": self._runs, "steps": self._steps, "requests": self._requests}[row.table].append(row)
        self.nbytes += row.nbytes
        opened = []
        while (len(self) > self.max_rows or self.nbytes > self.max_bytes) and (
                self._steps or self._requests):
            old = self._steps.popleft() if self._steps else self._requests.popleft()
            self.nbytes -= old.nbytes
            run_id = old.values["run_id"]
            loss = self._losses.get(run_id)
            if loss is None:
                loss = self._losses[run_id] = Loss(run_id, reason)
                opened.append(loss)
            if old.table == "steps":
                loss.add_step(old.values["seq"], old.values["step"])
                self.dropped_steps += 1
            else:
                loss.num_requests += 1
                self.dropped_requests += 1
        return opened

    def finish(self, run_id: str, ts: float) -> None:
        self._finishes.append((run_id, ts))

    def write(self, db: sqlite_utils.Database, isolate: bool) -> list[tuple[str, BaseException]]:
        """Write everything held in one transaction (runs first: the rest refer to them).

        Raises on any failure, and the transaction rolls back. With ``isolate``, rows
        go one by one and those the database refuses (``db.is_fault`` is False) come
        back as (table, error) instead of failing the batch."""
        bad: list[tuple[str, BaseException]] = []
        with db.atomic():
            for table, rows in (("runs", self._runs), ("steps", self._steps),
                                ("requests", self._requests)):
                if not isolate:
                    dbm.insert_rows(db, table, [r.values for r in rows])
                    continue
                for row in rows:
                    try:
                        dbm.insert_rows(db, table, [row.values])
                    except Exception as exc:
                        if dbm.is_fault(exc):
                            raise
                        bad.append((table, exc))
            for run_id, ts in self._finishes:
                db.execute("update runs set finished_at = ? where id = ?", [ts, run_id])
            if self._losses:
                lossm.ensure_table(db)
                dbm.insert_rows(db, lossm.TABLE, [x.to_row() for x in self._losses.values()])
        return bad

    def clear(self) -> None:
        """Everything held was committed (or skipped as unstorable)."""
        self._runs.clear()
        self._steps.clear()
        self._requests.clear()
        self._finishes.clear()
        self._losses.clear()
        self.nbytes = 0

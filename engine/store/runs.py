"""RunStore: read and manage stored runs (list, label, delete, load, replay to a step).

Readers open a short-lived connection per call, so the dashboard and CLI never
hold locks the recorder needs. Writer of labels and deletions only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlite_utils

from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.reducer import PoolState
from engine.events.folds.run_kind import AnySnapshot, AnyState, RunKind, empty_state
from engine.events.schema.step import StepRecord
from engine.store import db as dbm
from engine.store import loss as lossm
from engine.store.loss import Loss


class UnknownRunError(LookupError):
    """No run with this id in the database."""

    def __str__(self) -> str:  # LookupError would print the repr of the args
        return str(self.args[0]) if self.args else "unknown run"


class StepOutOfRangeError(ValueError):
    """The requested step is outside the run's recorded steps."""


def _step_record(row: dict[str, Any]) -> StepRecord:
    return StepRecord.from_dict({**row, "events": dbm.loads(row["events"], []),
                                 "metrics": dbm.loads(row["metrics"], {})})


class StepsLostError(ValueError):
    """The pool at this step cannot be rebuilt: steps before it were lost (see ``Loss``)."""


def _run_row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["config"] = dbm.loads(row.get("config"), {})
    out["kind"] = RunKind.of(row.get("kind")).value  # NULL: recorded before kinds, an engine run
    return out


class RunStore:
    """Runs in one SQLite file (default ``data/runs.sqlite``, or ``$KVSCOPE_DB``)."""

    def __init__(self, path: str | None = None, *, busy_timeout_s: float = 5.0) -> None:
        self.path = dbm.resolve_db_path(path)
        self.busy_timeout_s = busy_timeout_s

    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite_utils.Database]:
        """A connection with the schema in place, closed afterwards."""
        d = dbm.connect(self.path, busy_timeout_s=self.busy_timeout_s)
        try:
            yield d
        finally:
            d.close()

    # ---- runs ------------------------------------------------------------------

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run, newest first: id, kind, started_at, finished_at, model, label, config
        (dict), num_steps, num_requests, lost_steps and lost_requests (see ``losses``)."""
        with self.db() as d:
            # A database that never lost a row has no losses table (the recorder makes it).
            lost = (f"(select coalesce(sum({{}}), 0) from {lossm.TABLE} x where x.run_id = r.id)"
                    if lossm.TABLE in d.table_names() else "0")
            sql = f"""
                select r.*,
                  (select count(*) from steps s where s.run_id = r.id) as num_steps,
                  (select count(*) from requests q where q.run_id = r.id) as num_requests,
                  {lost.format("num_steps")} as lost_steps,
                  {lost.format("num_requests")} as lost_requests
                from runs r order by r.started_at desc, r.id desc"""
            return [_run_row(row) for row in d.query(sql)]

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The run's row (config decoded); UnknownRunError if absent."""
        with self.db() as d:
            rows = list(d.query("select * from runs where id = ?", [run_id]))
        if not rows:
            raise UnknownRunError(f"no run {run_id!r} in {self.path}")
        return _run_row(rows[0])

    def label_run(self, run_id: str, label: str | None) -> None:
        """Set (or clear, with None) a run's label."""
        with self.db() as d:
            cur = d.execute("update runs set label = ? where id = ?", [label, run_id])
            if cur.rowcount == 0:
                raise UnknownRunError(f"no run {run_id!r} in {self.path}")

    def delete_run(self, run_id: str) -> None:
        """Remove a run with its steps, requests and loss markers, in one transaction."""
        with self.db() as d:
            with d.atomic():
                cur = d.execute("delete from runs where id = ?", [run_id])
                if cur.rowcount == 0:
                    raise UnknownRunError(f"no run {run_id!r} in {self.path}")
                d.execute("delete from steps where run_id = ?", [run_id])
                d.execute("delete from requests where run_id = ?", [run_id])
                if lossm.TABLE in d.table_names():
                    d.execute(f"delete from {lossm.TABLE} where run_id = ?", [run_id])

    # ---- steps and requests ---------------------------------------------------

    def load_steps(self, run_id: str, upto_step: int | None = None) -> list[StepRecord]:
        """The run's StepRecords in seq order (only those with step <= ``upto_step``)."""
        self.get_run(run_id)
        where, args = "run_id = ?", [run_id]
        if upto_step is not None:
            where, args = where + " and step <= ?", args + [upto_step]
        with self.db() as d:
            rows = list(d["steps"].rows_where(where, args, order_by="seq"))
        return [_step_record(r) for r in rows]

    def steps_after(self, run_id: str, seq: int, before_seq: int | None = None,
                    limit: int | None = None) -> list[StepRecord]:
        """Up to ``limit`` of the run's StepRecords with ``seq`` < their seq (< ``before_seq``),
        in seq order: the rows a live client missed, not the whole run."""
        self.get_run(run_id)
        where, args = "run_id = ? and seq > ?", [run_id, seq]
        if before_seq is not None:
            where, args = where + " and seq < ?", args + [before_seq]
        with self.db() as d:
            rows = list(d["steps"].rows_where(where, args, order_by="seq", limit=limit))
        return [_step_record(r) for r in rows]

    def step_range(self, run_id: str) -> tuple[int, int] | None:
        """(first, last) recorded step of the run, or None when it has no steps."""
        self.get_run(run_id)
        with self.db() as d:
            lo, hi = d.execute("select min(step), max(step) from steps where run_id = ?",
                               [run_id]).fetchone()
        return None if lo is None else (lo, hi)

    def load_requests(self, run_id: str) -> list[dict[str, Any]]:
        """The run's requests with params/outputs/timings decoded, by request id."""
        self.get_run(run_id)
        with self.db() as d:
            rows = list(d["requests"].rows_where("run_id = ?", [run_id], order_by="request_id"))
        for r in rows:
            for k in ("params", "outputs", "timings"):
                r[k] = dbm.loads(r[k])
        return rows

    def losses(self, run_id: str) -> list[Loss]:
        """Where the recorder dropped this run's rows (a database fault outlasted its
        backlog), oldest first; [] for a complete run."""
        self.get_run(run_id)
        with self.db() as d:
            if lossm.TABLE not in d.table_names():
                return []
            rows = d[lossm.TABLE].rows_where("run_id = ?", [run_id], order_by="ts, first_seq")
            return [Loss.from_row(r) for r in rows]

    # ---- replay ----------------------------------------------------------------

    def state_at(self, run_id: str, step: int | None = None) -> AnyState:
        """The folded state after ``step`` (default: the last recorded step): a
        ``PoolState`` for an engine run, a ``HashCacheState`` for an attached one.

        StepsLostError when steps at or before ``step`` were lost."""
        run = self.get_run(run_id)
        try:
            state = empty_state(run["kind"], run["config"])
        except ValueError as exc:
            raise ValueError(f"run {run_id!r}: {exc}") from exc
        rng = self.step_range(run_id)
        if rng is None:
            raise StepOutOfRangeError(f"run {run_id!r} has no recorded steps")
        if step is None:
            step = rng[1]
        if not rng[0] <= step <= rng[1]:
            raise StepOutOfRangeError(f"step {step} is out of range: run {run_id!r} has "
                                      f"steps {rng[0]}..{rng[1]}")
        gaps = [x for x in self.losses(run_id) if x.num_steps and x.first_step <= step]
        if gaps:  # folding across missing events would rebuild a state that never existed
            first = gaps[0]
            raise StepsLostError(f"run {run_id!r}: {first.describe()}; the state can be rebuilt "
                                 f"up to step {first.first_step - 1} only")
        for rec in self.load_steps(run_id, upto_step=step):
            state.apply_step(rec)
        state.step = step
        return state

    def snapshot_at(self, run_id: str, step: int | None = None) -> AnySnapshot:
        """The snapshot after ``step``, rebuilt by replaying from the empty state
        (a ``PoolSnapshot``, or a ``HashCacheSnapshot`` for an attached run)."""
        return self.state_at(run_id, step).to_snapshot()

    def metrics_at(self, run_id: str, step: int) -> dict[str, Any] | None:
        """The metrics recorded with the latest step record at or before ``step``."""
        with self.db() as d:
            row = d.execute("select metrics from steps where run_id = ? and step <= ? "
                            "order by seq desc limit 1", [run_id, step]).fetchone()
        return None if row is None else dbm.loads(row[0], {})

"""Recorder: appends a run's steps and requests to SQLite off the engine's hot path.

The engine thread only enqueues (O(1), never touches the database, never raises
because of it). One writer thread drains the queue in batches, one transaction
per batch. If the database is locked, read-only or corrupt, the writer logs one
``logging.error``, sets ``healthy = False`` and ``fault`` (why), keeps the unsaved
rows in memory (bounded by ``max_pending``) and retries every ``retry_s``; when a
write succeeds again (e.g. the lock is released) it resumes and logs that.
Writes are idempotent (INSERT OR REPLACE by primary key), so a retried batch
never duplicates rows, and committed rows are never rewritten or deleted.

Writer: this class is the only writer of the ``runs``/``steps``/``requests`` rows
of the runs it starts. Published StepRecords must not be mutated afterwards:
they are serialised on the writer thread.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from typing import Any

from engine.events.step import StepRecord
from engine.store import db as dbm

log = logging.getLogger("kvscope.store")

_STOP = object()


class _Flush:
    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class Recorder:
    """Batched, fault-tolerant run recorder (see module docstring)."""

    def __init__(self, path: str | None = None, *, busy_timeout_s: float = 2.0,
                 retry_s: float = 1.0, max_pending: int = 200_000) -> None:
        if retry_s <= 0 or busy_timeout_s < 0 or max_pending < 1:
            raise ValueError("retry_s must be > 0, busy_timeout_s >= 0, max_pending >= 1")
        self.path = dbm.resolve_db_path(path)
        self.busy_timeout_s = busy_timeout_s
        self.retry_s = retry_s
        self.max_pending = max_pending
        self.run_id: str | None = None
        self.healthy = True
        self.fault: str | None = None  # why recording is paused; None while healthy
        self.dropped = 0  # rows discarded because the backlog passed max_pending
        self.written = 0  # rows committed by this recorder
        self._closed = False
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kvscope-recorder", daemon=True)
        self._thread.start()

    # ---- engine-side API (cheap, never raises on database trouble) ----------

    def start_run(self, config: dict[str, Any], model: str | None = None,
                  label: str | None = None, run_id: str | None = None) -> str:
        """Begin a run; returns its id at once (the row is written in the background).

        ``config`` must be JSON-able and hold ``num_blocks`` and ``block_size``."""
        for key in ("num_blocks", "block_size"):
            if key not in config:
                raise ValueError(f"run config needs {key!r} so the run can be replayed")
        rid = run_id or dbm.new_run_id()
        self._put(("runs", {"id": rid, "started_at": time.time(), "finished_at": None,
                            "config": dbm.dumps(config), "model": model, "label": label}))
        self.run_id = rid
        return rid

    def record_step(self, record: StepRecord, run_id: str | None = None) -> None:
        """Queue one step for the current (or given) run."""
        self._put(("steps", (self._run(run_id), record)))

    def record_request(self, request_id: str, prompt: str | None = None,
                       params: dict[str, Any] | None = None, outputs: Any = None,
                       timings: dict[str, Any] | None = None, run_id: str | None = None,
                       source: str | None = None) -> None:
        """Queue a finished request: prompt text, sampling params, outputs, timings (JSON-able),
        and its source (the front door it came through: ``websocket``, ``openai``; None: offline)."""
        self._put(("requests", {"run_id": self._run(run_id), "request_id": request_id,
                                "prompt": prompt, "params": dbm.dumps(params),
                                "outputs": dbm.dumps(outputs), "timings": dbm.dumps(timings),
                                "source": source}))

    def finish(self, run_id: str | None = None) -> None:
        """Mark the run finished (finished_at = now)."""
        self._put(("finish", (self._run(run_id), time.time())))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued so far is committed; False if it could not be
        (a fault, or ``timeout`` passed). Never raises because of the database."""
        if not self._thread.is_alive():
            return False
        marker = _Flush()
        self._q.put(marker)
        return marker.done.wait(timeout) and marker.ok

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush, stop the writer and close the database; True if nothing was lost."""
        if self._closed:
            return self.healthy
        ok = self.flush(timeout)
        self._closed = True
        self._q.put(_STOP)
        self._thread.join(timeout)
        if not ok:
            log.error("kvscope recorder closed with unsaved rows (%s); the run in %s is "
                      "incomplete", self.fault or "timeout", self.path)
        return ok

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, run_id: str | None) -> str:
        rid = run_id or self.run_id
        if rid is None:
            raise ValueError("no run: call start_run() first or pass run_id")
        return rid

    def _put(self, item: Any) -> None:
        if self._closed:
            raise RuntimeError("recorder is closed")
        self._q.put(item)

    # ---- writer thread -----------------------------------------------------

    def _loop(self) -> None:
        db = None
        pending: deque = deque()
        stop = False
        while not stop:
            # Sleep until work arrives; while rows wait on a fault, wake to retry.
            try:
                items = [self._q.get(timeout=self.retry_s if pending else None)]
            except queue.Empty:
                items = []
            while True:  # drain: everything queued so far becomes one batch
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            flushes = []
            for it in items:
                if it is _STOP:
                    stop = True
                elif isinstance(it, _Flush):
                    flushes.append(it)
                else:
                    pending.append(it)
            self._bound(pending)
            if pending:
                db = self._write(db, pending)
            for f in flushes:
                f.ok = not pending
                f.done.set()
        if db is not None:
            db.close()

    def _bound(self, pending: deque) -> None:
        over = len(pending) - self.max_pending
        if over > 0:
            for _ in range(over):
                pending.popleft()
            if self.dropped == 0:
                log.error("kvscope recorder: backlog passed %d rows while %s; dropping the "
                          "oldest (replay of this run will be incomplete)", self.max_pending,
                          self.fault)
            self.dropped += over

    def _write(self, db: Any, pending: deque) -> Any:
        """Commit ``pending`` in one transaction; returns the (possibly reopened) db."""
        try:
            if db is None:
                db = dbm.connect(self.path, busy_timeout_s=self.busy_timeout_s)
            rows: dict[str, list] = {"runs": [], "steps": [], "requests": []}
            finishes = []
            for kind, payload in pending:
                if kind == "steps":
                    rid, rec = payload
                    d = rec.to_dict()
                    rows["steps"].append({"run_id": rid, "seq": d["seq"], "step": d["step"],
                                          "ts": d["ts"], "events": dbm.dumps(d["events"]),
                                          "metrics": dbm.dumps(d["metrics"])})
                elif kind == "finish":
                    finishes.append(payload)
                else:
                    rows[kind].append(payload)
            with db.atomic():
                for table in ("runs", "steps", "requests"):
                    if rows[table]:
                        db[table].insert_all(rows[table], replace=True)
                for rid, ts in finishes:
                    db.execute("update runs set finished_at = ? where id = ?", [ts, rid])
        except (sqlite3.Error, OSError) as exc:
            self._on_fault(exc)
            if db is not None:
                try:  # reopen on retry: a fresh connection sees a replaced or repaired file
                    db.close()
                except sqlite3.Error:
                    pass
            return None
        self.written += len(pending)
        pending.clear()
        if not self.healthy:
            log.warning("kvscope recorder: %s resolved, recording resumed in %s",
                        self.fault, self.path)
            self.healthy, self.fault = True, None
        return db

    def _on_fault(self, exc: BaseException) -> None:
        cause = dbm.describe_error(exc)
        fault = f"{cause} ({self.path})"
        if fault != self.fault:  # once per distinct fault, not once per retry/step
            log.error("kvscope recorder: %s: %s; recording paused, the engine keeps serving; "
                      "retrying every %.1fs", fault, exc, self.retry_s)
        self.healthy, self.fault = False, fault

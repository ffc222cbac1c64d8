"""Recorder: appends a run's steps and requests to SQLite off the engine's hot path.

(Past 300 lines because the engine-side API and the writer's retry policy share the
counters ``health()`` reads; the row handling lives in ``backlog`` and ``db``.)

The engine thread only enqueues (O(1), never touches the database, never raises
because of it). One writer thread drains the queue, prepares each row once
(serialised and checked by ``db.check_row``) into a bounded ``Backlog``, and commits
it in one transaction per wake-up. Writes are idempotent (INSERT OR REPLACE by
primary key) and all-or-nothing, so a retry never duplicates rows, and committed
rows are never rewritten or deleted.

Faults (locked, read-only, full, corrupt): one ``logging.error`` per distinct fault,
``fault`` says why, the prepared rows stay held. Retries come ``retry_s`` later,
the wait doubling per failure up to ``max_retry_s``; rows arriving meanwhile are
only prepared, so a fault costs the engine no more than healthy recording. Past
``max_pending`` rows or ``max_pending_bytes`` the oldest steps are dropped, counted
and marked in the run (``Loss``). The first write that succeeds resumes (logged).
Bad rows (a lone surrogate in an id or prompt, an int past 64 bits, a value that
is not JSON) are skipped and counted: one row never stops a run's recording.
``health()`` reports all of this to any thread (``RecorderHealth``).

Writer: this class is the only writer of the ``runs``/``steps``/``requests``/
``losses`` rows of the runs it starts. Published StepRecords must not be mutated
afterwards (the writer thread serialises them). ``record_step`` is called from one
thread (the engine's), the only writer of the steps-in count.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from engine.events.folds.run_kind import RunKind
from engine.events.schema.step import StepRecord
from engine.store import db as dbm
from engine.store.backlog import Backlog, Row
from engine.store.recorder_health import RecorderHealth

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
                 retry_s: float = 1.0, max_retry_s: float = 30.0, max_pending: int = 200_000,
                 max_pending_bytes: int = 256 << 20) -> None:
        if retry_s <= 0 or max_retry_s < retry_s or busy_timeout_s < 0 or max_pending < 1 \
                or max_pending_bytes < 1:
            raise ValueError("retry_s must be > 0 and <= max_retry_s, busy_timeout_s >= 0, "
                             "max_pending >= 1 and max_pending_bytes >= 1")
        self.path = dbm.resolve_db_path(path)
        self.busy_timeout_s = busy_timeout_s
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        self.max_pending = max_pending
        self.run_id: str | None = None
        # Written by the writer thread; read by anyone (each is one attribute read).
        self.fault: str | None = None  # why recording is paused; None while healthy
        self.last_error: str | None = None
        self.written = 0  # rows committed by this recorder
        self.errors = 0  # failed write attempts (and unexpected writer errors)
        self.skipped = 0  # rows that could never be stored
        self._steps_out = 0  # steps committed, dropped or skipped
        self._steps_in = 0  # steps queued (written by record_step's thread only)
        self._failures = 0  # consecutive failed attempts: the backoff exponent
        self._next_try = 0.0  # monotonic time of the next retry while faulted
        self._backlog = Backlog(max_pending, max_pending_bytes)
        self._closed = False
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="kvscope-recorder", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.fault is None

    @property
    def dropped(self) -> int:
        """Rows dropped because the backlog passed its bound (steps and requests)."""
        return self._backlog.dropped_steps + self._backlog.dropped_requests

    def health(self) -> RecorderHealth:
        """A snapshot for ``/healthz`` and ``/metrics``; safe from any thread."""
        out = self._steps_out  # read before _steps_in: out never passes in, so the backlog is >= 0
        return RecorderHealth(
            alive=self._thread.is_alive(), backlog_steps=max(0, self._steps_in - out),
            errors_total=self.errors, dropped_steps_total=self._backlog.dropped_steps,
            dropped_requests_total=self._backlog.dropped_requests, skipped_rows_total=self.skipped,
            written_rows_total=self.written, fault=self.fault, last_error=self.last_error)

    # ---- engine-side API (cheap, never raises on database trouble) ----------

    def start_run(self, config: dict[str, Any], model: str | None = None,
                  label: str | None = None, run_id: str | None = None,
                  kind: RunKind | str = RunKind.ENGINE) -> str:
        """Begin a run; returns its id at once (the row is written in the background).

        ``config`` must be JSON-able; an engine run's must hold ``num_blocks`` and
        ``block_size``. ``kind``: what the run records (``engine.events.folds.run_kind``)."""
        kind = RunKind.of(kind)
        if kind is not RunKind.ATTACHED:
            for key in ("num_blocks", "block_size"):
                if key not in config:
                    raise ValueError(f"run config needs {key!r} so the run can be replayed")
        rid = run_id or dbm.new_run_id()
        self._put(("runs", {"id": rid, "started_at": time.time(), "finished_at": None,
                            "config": dbm.dumps(config), "model": model, "label": label,
                            "kind": kind.value}))
        self.run_id = rid
        return rid

    def record_step(self, record: StepRecord, run_id: str | None = None) -> None:
        """Queue one step for the current (or given) run."""
        self._put(("steps", (self._run(run_id), record)))
        self._steps_in += 1

    def record_request(self, request_id: str, prompt: str | None = None,
                       params: dict[str, Any] | None = None, outputs: Any = None,
                       timings: dict[str, Any] | None = None, run_id: str | None = None,
                       source: str | None = None) -> None:
        """Queue a finished request: prompt text, sampling params, outputs, timings (JSON-able),
        and its source (the front door it came through: ``websocket``, ``openai``; None: offline).

        Serialised here, on the caller's thread, because the caller may reuse these
        objects; one that is not JSON-able is skipped and counted, never raised."""
        rid = self._run(run_id)
        try:
            row = {"run_id": rid, "request_id": request_id, "prompt": prompt,
                   "params": dbm.dumps(params), "outputs": dbm.dumps(outputs),
                   "timings": dbm.dumps(timings), "source": source}
        except (TypeError, ValueError) as exc:
            row = exc  # the writer thread counts and logs it, so those figures keep one writer
        self._put(("requests", row))

    def finish(self, run_id: str | None = None) -> None:
        """Mark the run finished (finished_at = now)."""
        self._put(("finish", (self._run(run_id), time.time())))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything queued so far is committed; False if it could not be
        (a fault, or ``timeout`` passed). A flush tries the database once at once,
        even while a retry is not yet due. Never raises because of the database."""
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
        stop = False
        while not stop:
            flushes: list[_Flush] = []
            try:
                for it in self._take():
                    if it is _STOP:
                        stop = True
                    elif isinstance(it, _Flush):
                        flushes.append(it)
                    else:
                        if self._backlog.full and self._due():  # a burst: write before dropping
                            db = self._attempt(db)
                        self._absorb(*it)
                if self._backlog and (self._due() or flushes or stop):
                    db = self._attempt(db)
            except Exception as exc:  # a bug here may cost a retry, never the recorder
                log.exception("kvscope recorder: unexpected error; retrying with backoff")
                db = self._failed(db, exc)
            finally:
                for f in flushes:
                    f.ok = not self._backlog
                    f.done.set()
        if db is not None:
            db.close()

    def _due(self) -> bool:
        return self.fault is None or time.monotonic() >= self._next_try

    def _take(self) -> list[Any]:
        """Block until work arrives (or, with rows held on a fault, until the retry is
        due); then everything queued so far, as one batch."""
        timeout = None
        if self._backlog:
            timeout = max(0.0, self._next_try - time.monotonic()) if self.fault else 0.0
        try:
            items = [self._q.get(timeout=timeout)]
        except queue.Empty:
            items = []
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items

    def _absorb(self, kind: str, payload: Any) -> None:
        """Prepare one queued row (the only serialisation it gets) into the backlog."""
        if kind == "finish":
            self._backlog.finish(*payload)
            return
        try:
            if isinstance(payload, Exception):
                raise payload
            values = dbm.step_row(payload[0], payload[1]) if kind == "steps" else payload
            nbytes = dbm.check_row(values)
        except Exception as exc:
            self._skip(kind, exc)
            return
        before = self._backlog.dropped_steps
        for loss in self._backlog.add(Row(kind, values, nbytes), self.fault or "the writer fell behind"):
            log.error("kvscope recorder: backlog passed %d rows or %d bytes while %s; dropping "
                      "the oldest steps of run %s (marked in the run as lost)",
                      self.max_pending, self._backlog.max_bytes, loss.reason, loss.run_id)
        self._steps_out += self._backlog.dropped_steps - before

    def _skip(self, kind: str, exc: BaseException) -> None:
        self.skipped += 1
        if kind == "steps":
            self._steps_out += 1
        self.last_error = f"skipped a {kind} row: {type(exc).__name__}: {exc}"
        if _decade(self.skipped):  # 1st, 10th, 100th...: the log stays small under a flood
            log.error("kvscope recorder: %s (%d rows skipped so far); recording goes on",
                      self.last_error, self.skipped)

    def _attempt(self, db: Any) -> Any:
        """Commit the backlog in one transaction; returns the (possibly reopened) db."""
        try:
            if db is None:
                db = dbm.connect(self.path, busy_timeout_s=self.busy_timeout_s)
            try:
                bad = self._backlog.write(db, isolate=False)
            except Exception as exc:
                if dbm.is_fault(exc):
                    raise
                # Rows passed check_row, yet the database refused one: find it row by row.
                bad = self._backlog.write(db, isolate=True)
        except Exception as exc:
            if not dbm.is_fault(exc):
                raise
            return self._failed(db, exc)
        steps = self._backlog.num_steps
        self.written += len(self._backlog) - len(bad)
        self._backlog.clear()
        for kind, exc in bad:
            self._skip(kind, exc)
        self._steps_out += steps - sum(kind == "steps" for kind, _ in bad)
        self._failures = 0
        if self.fault is not None:
            log.warning("kvscope recorder: %s resolved, recording resumed in %s", self.fault, self.path)
            self.fault = None
        return db

    def _failed(self, db: Any, exc: BaseException) -> None:
        """A failed attempt: count it, say so once per distinct fault, back off. Returns
        None: the next attempt reopens, and a fresh connection sees a replaced file."""
        self.errors += 1
        self._failures += 1
        self._next_try = time.monotonic() + min(self.max_retry_s,
                                                self.retry_s * 2 ** min(self._failures - 1, 60))
        fault = f"{dbm.describe_error(exc)} ({self.path})"
        self.last_error = f"{fault}: {exc}"
        if fault != self.fault:  # once per distinct fault, not once per retry/step
            log.error("kvscope recorder: %s: %s; recording paused, the engine keeps serving; "
                      "retrying after %gs, backing off up to %gs", fault, exc, self.retry_s,
                      self.max_retry_s)
        self.fault = fault
        if db is not None:
            try:
                db.close()
            except Exception:
                pass
        return None


def _decade(n: int) -> bool:
    """1, 10, 100, ...: which counts are worth a log line."""
    while n % 10 == 0:
        n //= 10
    return n == 1

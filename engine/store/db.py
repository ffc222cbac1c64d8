"""Where the runs database lives, how to open it, and its schema (sqlite-utils).

Tables (JSON columns hold compact ASCII JSON text, ``engine.events.schema.json_text``):
- ``runs``: id TEXT pk, started_at REAL (unix s), finished_at REAL|NULL, config JSON
  (an engine run's must hold ``num_blocks`` and ``block_size`` for replay), model TEXT,
  label TEXT, kind TEXT (``engine.events.folds.run_kind``: ``engine`` | ``attached``; NULL in
  databases from before kinds, read as ``engine``; added to such a table on open).
- ``steps``: (run_id, seq) pk, step, ts REAL, events JSON (list of event dicts),
  metrics JSON — one ``StepRecord`` per row.
- ``requests``: (run_id, request_id) pk, prompt TEXT, params/outputs/timings JSON, source
  TEXT (``websocket`` | ``openai`` | NULL for offline runs; added to older files on open).

WAL mode, so the dashboard can read while the recorder writes.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlite_utils

from engine import envs
from engine.events.schema.json_text import compact
from engine.events.schema.step import StepRecord


def resolve_db_path(path: str | os.PathLike | None = None) -> str:
    """``path``, else ``$KVSCOPE_DB``, else ``data/runs.sqlite`` under the cwd.

    A ``file:`` URI (e.g. ``file:runs.sqlite?mode=ro``) is passed through as is."""
    if path is None:
        path = envs.DB.get()
    return str(path)


def is_uri(path: str) -> bool:
    return path.startswith("file:")


def connect(path: str | os.PathLike | None = None, *, busy_timeout_s: float = 5.0,
            schema: bool = True) -> sqlite_utils.Database:
    """Open (creating file and parent folders) and, with ``schema``, set up WAL and tables.

    Raises ``sqlite3.Error`` on a locked, read-only or corrupt database."""
    p = resolve_db_path(path)
    if not is_uri(p):
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(p, timeout=busy_timeout_s, uri=is_uri(p), check_same_thread=False)
    try:
        db = sqlite_utils.Database(conn)
        if schema:
            ensure_schema(db)
    except BaseException:
        conn.close()
        raise
    return db


def ensure_schema(db: sqlite_utils.Database) -> None:
    """Create the tables and indexes if missing; switch to WAL."""
    db.enable_wal()
    db["runs"].create({"id": str, "started_at": float, "finished_at": float, "config": str,
                       "model": str, "label": str, "kind": str}, pk="id", if_not_exists=True)
    if "kind" not in db["runs"].columns_dict:  # a database from before run kinds
        db["runs"].add_column("kind", str)
    db["steps"].create({"run_id": str, "seq": int, "step": int, "ts": float, "events": str,
                        "metrics": str}, pk=("run_id", "seq"), if_not_exists=True)
    db["steps"].create_index(["run_id", "step"], if_not_exists=True)
    db["requests"].create({"run_id": str, "request_id": str, "prompt": str, "params": str,
                           "outputs": str, "timings": str, "source": str},
                          pk=("run_id", "request_id"), if_not_exists=True)
    if "source" not in db["requests"].columns_dict:  # a file written before sources were recorded
        try:
            db["requests"].add_column("source", str)
        except sqlite3.OperationalError:  # opened read-only: its rows simply have no source
            pass


def new_run_id() -> str:
    """Sortable and short enough to type: ``20250101-120000-3fa2c1``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def dumps(value: Any) -> str:
    return compact(value)


def loads(text: str | None, default: Any = None) -> Any:
    return default if text is None else json.loads(text)


def step_row(run_id: str, rec: StepRecord | dict[str, Any]) -> dict[str, Any]:
    """The ``steps`` row of a step (events and metrics as JSON text): a ``StepRecord``
    gives the text it wrote for the step frame (``json_parts``), a dict (its
    ``to_dict()`` form, an import) is written here."""
    if isinstance(rec, StepRecord):
        events, metrics = rec.json_parts()
        return {"run_id": run_id, "seq": rec.seq, "step": rec.step, "ts": rec.ts,
                "events": events, "metrics": metrics}
    return {"run_id": run_id, "seq": rec["seq"], "step": rec["step"], "ts": rec["ts"],
            "events": dumps(rec["events"]), "metrics": dumps(rec["metrics"])}


_INT64 = (-(1 << 63), (1 << 63) - 1)


def check_row(row: dict[str, Any]) -> int:
    """Raise ValueError/TypeError for a value SQLite cannot store; else the row's text size.

    Catches before a write what would otherwise fail it: a lone surrogate (text
    must be UTF-8), an int past 64 bits, a type sqlite3 cannot bind. Cheap on the
    common path: ``isascii`` is O(1) in CPython, and JSON text is ASCII."""
    size = 0
    for key, v in row.items():
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ValueError(f"column {key!r} is not valid UTF-8 text: {exc}") from None
            size += len(v)
        elif isinstance(v, bool) or v is None or isinstance(v, float):
            pass
        elif isinstance(v, int):
            if not _INT64[0] <= v <= _INT64[1]:
                raise ValueError(f"column {key!r}: {v} does not fit SQLite's 64-bit INTEGER")
        else:
            raise TypeError(f"column {key!r}: SQLite cannot store a {type(v).__name__}")
    return size


def insert_rows(db: sqlite_utils.Database, table: str, rows: list[dict[str, Any]]) -> None:
    """INSERT OR REPLACE ``rows`` (all with the same keys) into ``table``."""
    if not rows:
        return
    cols = list(rows[0])
    sql = (f"insert or replace into [{table}] ({', '.join(f'[{c}]' for c in cols)}) "
           f"values ({', '.join('?' * len(cols))})")
    db.conn.executemany(sql, [[r[c] for c in cols] for r in rows])


def is_fault(exc: BaseException) -> bool:
    """True for a failure of the database (locked, read-only, full, corrupt, I/O): retry
    later. False for a row the database refuses (bad text, an int too large, an
    unbindable type): retrying cannot help, so that row is skipped."""
    if isinstance(exc, (sqlite3.InterfaceError, sqlite3.DataError, sqlite3.IntegrityError)):
        return False
    if isinstance(exc, sqlite3.ProgrammingError):  # also "closed database": only binding is a row's fault
        return "binding" not in str(exc).lower()
    if isinstance(exc, (sqlite3.Error, OSError, MemoryError)):
        return True
    return not isinstance(exc, (ValueError, TypeError, OverflowError))


def describe_error(exc: BaseException) -> str:
    """Short cause of a sqlite failure, for faults and log lines."""
    msg = str(exc).lower()
    if "locked" in msg or "busy" in msg:
        return "database is locked"
    if "full" in msg:
        return "database or disk is full"
    if "readonly" in msg or "read-only" in msg or "unable to open" in msg:
        return "database is read-only or cannot be opened"
    if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
        return "database file is corrupt"
    return f"{type(exc).__name__}: {exc}"

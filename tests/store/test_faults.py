"""A broken database pauses recording with one logged error; the caller never sees it."""

import logging
import os
import sqlite3
import time

import pytest

from engine.store import Recorder, RunStore
from tests.store.helpers import CONFIG, records, wait_until


def store_errors(caplog):
    return [r for r in caplog.records if r.name == "kvscope.store" and r.levelno >= logging.ERROR]


def committed_run(path):
    with Recorder(path) as rec:
        run_id = rec.start_run(CONFIG, label="kept")
        for r in records():
            rec.record_step(r)
    return run_id


def assert_paused(rec, caplog, cause):
    for r in records():  # more steps while faulted: no raise, no extra log lines
        rec.record_step(r)
    assert rec.flush(timeout=5) is False
    assert not rec.healthy and cause in rec.fault
    time.sleep(0.2)  # several retries pass
    assert len(store_errors(caplog)) == 1


def test_read_only_database(tmp_path, caplog):
    path = str(tmp_path / "runs.sqlite")
    run_id = committed_run(path)
    rec = Recorder(f"file:{path}?mode=ro", retry_s=0.05)  # SQLITE_READONLY, even for root
    rec.start_run(CONFIG, label="lost")
    assert_paused(rec, caplog, "read-only")
    assert rec.close(timeout=5) is False
    store = RunStore(path)
    assert [r["id"] for r in store.list_runs()] == [run_id]
    assert store.load_steps(run_id) == records()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file_permissions(tmp_path, caplog):
    path = str(tmp_path / "runs.sqlite")
    run_id = committed_run(path)
    os.chmod(path, 0o444)
    rec = Recorder(path, retry_s=0.05)
    rec.start_run(CONFIG)
    assert_paused(rec, caplog, "read-only")
    rec.close(timeout=5)
    os.chmod(path, 0o644)
    assert RunStore(path).load_steps(run_id) == records()


def test_locked_database_pauses_then_resumes(tmp_path, caplog):
    path = str(tmp_path / "runs.sqlite")
    rec = Recorder(path, busy_timeout_s=0.05, retry_s=0.05)
    run_id = rec.start_run(CONFIG)
    first, *rest = records()
    rec.record_step(first)
    assert rec.flush() and rec.healthy

    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    for r in rest:
        rec.record_step(r)
    assert rec.flush(timeout=5) is False
    assert not rec.healthy and "locked" in rec.fault
    time.sleep(0.2)
    assert len(store_errors(caplog)) == 1
    # committed rows are still there for readers (WAL) while the lock is held
    assert RunStore(path, busy_timeout_s=0.1).load_steps(run_id) == [first]

    other.execute("ROLLBACK")
    other.close()
    assert wait_until(lambda: rec.healthy)
    assert rec.flush(timeout=5) and rec.fault is None
    assert rec.close(timeout=5)
    assert RunStore(path).load_steps(run_id) == records()
    assert len(store_errors(caplog)) == 1


def test_corrupt_file(tmp_path, caplog):
    path = tmp_path / "runs.sqlite"
    garbage = bytes(range(256)) * 64
    path.write_bytes(garbage)
    rec = Recorder(str(path), retry_s=0.05)
    rec.start_run(CONFIG)
    assert_paused(rec, caplog, "corrupt")
    assert rec.close(timeout=5) is False
    assert path.read_bytes() == garbage  # never overwritten or recreated


def test_backlog_is_bounded_while_faulted(tmp_path, caplog):
    path = tmp_path / "runs.sqlite"
    path.write_bytes(b"x" * 4096)
    rec = Recorder(str(path), retry_s=0.05, max_pending=5)
    rec.start_run(CONFIG)
    for _ in range(4):
        for r in records():
            rec.record_step(r)
    assert rec.flush(timeout=5) is False
    assert rec.dropped == 1 + 12 - 5
    rec.close(timeout=5)

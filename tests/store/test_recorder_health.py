"""RecorderHealth in each state, the degraded decision, and how the server reads both."""

import sqlite3
import threading

import pytest

from engine.server.worker.health import Health, HealthBoard, Status
from engine.server.metrics.prom import ServerMetrics
from engine.store import Recorder, RecorderHealth, recorder_problem
from engine.store.recorder_health import BEHIND_STEPS
from tests.store.helpers import CONFIG, FaultyDb, padded, records, wait_until

OK = RecorderHealth(alive=True, backlog_steps=3, errors_total=0, dropped_steps_total=0,
                    dropped_requests_total=0, skipped_rows_total=0, written_rows_total=10)


def make(**kw):
    return RecorderHealth(**{**OK.to_dict(), **kw})


def test_problem_for_each_state():
    assert recorder_problem(OK) is None
    assert recorder_problem(make(skipped_rows_total=5, errors_total=2, last_error="old")) is None
    assert recorder_problem(make(backlog_steps=BEHIND_STEPS)) is None
    assert recorder_problem(make(backlog_steps=BEHIND_STEPS + 1)) == (
        f"recorder behind: {BEHIND_STEPS + 1} steps waiting to be written (more than {BEHIND_STEPS})")
    assert recorder_problem(make(backlog_steps=7), behind_steps=5).startswith("recorder behind: 7")
    assert recorder_problem(make(fault="database or disk is full (x.db)", backlog_steps=40,
                                 dropped_steps_total=9)) == (
        "recorder failing: database or disk is full (x.db); 40 steps waiting, 9 dropped so far; "
        "serving continues")
    assert recorder_problem(make(alive=False, fault="f", last_error="KeyError: 1")) == (
        "recorder is down (last error: KeyError: 1): steps are no longer recorded")
    assert recorder_problem(make(alive=False)) == "recorder is down: steps are no longer recorded"


def test_live_health_healthy_then_failing_then_recovered(tmp_path, monkeypatch):
    faulty = FaultyDb(monkeypatch)
    rec = Recorder(str(tmp_path / "runs.sqlite"), retry_s=0.02, max_retry_s=0.05)
    rec.start_run(CONFIG)
    for r in records():
        rec.record_step(r)
    assert rec.flush(timeout=5)
    assert rec.health() == RecorderHealth(True, 0, 0, 0, 0, 0, 4)
    faulty.set("read-only")
    for seq in range(3, 8):
        rec.record_step(padded(seq))
    assert rec.flush(timeout=5) is False
    h = rec.health()
    assert h.alive and h.backlog_steps == 5 and h.errors_total >= 1
    assert "read-only" in h.fault and h.last_error.startswith(h.fault)
    assert recorder_problem(h).startswith("recorder failing: database is read-only")
    faulty.set(None)
    assert wait_until(lambda: rec.health().fault is None)
    h = rec.health()
    assert (h.backlog_steps, h.written_rows_total) == (0, 9) and recorder_problem(h) is None
    assert "read-only" in h.last_error  # kept, so an operator can still see what happened
    rec.close(timeout=5)
    assert not rec.health().alive and recorder_problem(rec.health()).startswith("recorder is down")


def test_live_health_behind_while_a_write_waits_on_a_lock(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    rec = Recorder(path, busy_timeout_s=30)
    rec.start_run(CONFIG)
    assert rec.flush(timeout=5)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        rec.record_step(padded(0))  # the writer now waits inside this write (busy timeout)
        assert wait_until(lambda: rec.health().backlog_steps == 1)
        for seq in range(1, 12):
            rec.record_step(padded(seq))
        h = rec.health()
        assert h.fault is None and h.backlog_steps == 12 and h.errors_total == 0
        assert recorder_problem(h, behind_steps=10).startswith("recorder behind: 12 steps")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert rec.flush(timeout=10) and rec.health().backlog_steps == 0
    rec.close(timeout=5)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_live_health_down_when_the_writer_thread_died(tmp_path, monkeypatch):
    def die(self):
        raise SystemExit  # not an Exception: nothing in the writer may swallow it

    monkeypatch.setattr(Recorder, "_take", die)
    rec = Recorder(str(tmp_path / "runs.sqlite"))
    rec._thread.join(5)
    rec.start_run(CONFIG)
    rec.record_step(records()[0])
    h = rec.health()
    assert not h.alive and h.backlog_steps == 1
    assert recorder_problem(h) == "recorder is down: steps are no longer recorded"
    assert rec.flush(timeout=1) is False


@pytest.mark.parametrize("status", list(Status))
def test_board_is_degraded_only_when_ready_and_the_recorder_has_a_problem(status):
    board = HealthBoard("tiny")
    board.set(Health(status, "engine says", "run-1", "tiny", {"num_blocks": 4}))
    assert board.current.recorder is None  # not recording: nothing to say
    state = {"h": OK}
    board.watch_recorder(lambda: state["h"])
    assert board.current.status is status and board.current.recorder == OK
    assert board.current.to_dict()["recorder"] == OK.to_dict()
    state["h"] = make(fault="database is locked (x.db)")
    cur = board.current
    if status is Status.READY:
        assert cur.status is Status.DEGRADED and cur.detail.startswith("recorder failing: database is locked")
        d = cur.to_dict()
        assert d["status"] == "degraded" and d["run_id"] == "run-1" and d["num_blocks"] == 4
        assert d["recorder"]["fault"] == "database is locked (x.db)" and cur.serving
    else:  # loading, error and stopping say what the engine says
        assert (cur.status, cur.detail) == (status, "engine says")
    state["h"] = OK
    assert board.current.status is status


def test_metrics_read_the_recorder_at_scrape_time():
    state = {"h": OK}
    m = ServerMetrics("tiny")
    m.watch_recorder(lambda: state["h"])

    def scrape():
        return {line.split("{")[0]: float(line.split()[-1]) for line in m.render().decode().splitlines()
                if line.startswith("kvscope_recorder_")}

    assert scrape() == {
        "kvscope_recorder_errors_total": 0, "kvscope_recorder_dropped_steps_total": 0,
        "kvscope_recorder_dropped_requests_total": 0, "kvscope_recorder_skipped_rows_total": 0,
        "kvscope_recorder_written_rows_total": 10, "kvscope_recorder_backlog_steps": 3,
        "kvscope_recorder_up": 1}
    state["h"] = make(errors_total=7, dropped_steps_total=41, dropped_requests_total=2,
                      skipped_rows_total=1, backlog_steps=19, fault="full")
    got = scrape()
    assert (got["kvscope_recorder_errors_total"], got["kvscope_recorder_dropped_steps_total"],
            got["kvscope_recorder_dropped_requests_total"], got["kvscope_recorder_skipped_rows_total"],
            got["kvscope_recorder_backlog_steps"], got["kvscope_recorder_up"]) == (7, 41, 2, 1, 19, 0)
    assert "# TYPE kvscope_recorder_errors_total counter" in m.render().decode()


def test_health_is_readable_from_any_thread_while_recording(tmp_path):
    rec = Recorder(str(tmp_path / "runs.sqlite"))
    rec.start_run(CONFIG)
    seen, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            seen.append(rec.health())

    reader = threading.Thread(target=read)
    reader.start()
    for seq in range(300):
        rec.record_step(padded(seq, pad=10))
    assert rec.flush(timeout=10)
    stop.set()
    reader.join()
    assert seen and all(h.backlog_steps >= 0 and h.alive for h in seen)
    assert rec.health().backlog_steps == 0 and rec.health().written_rows_total == 301
    rec.close()

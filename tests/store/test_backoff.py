"""A read-only or full database costs serving nothing: retries back off, each step is
serialised once, the backlog is bounded and what it dropped is marked in the run."""

import argparse
import logging
import threading
import time

import pytest

from engine.events.schema.step import StepRecord
from engine.store import Recorder, RunStore, StepsLostError
from engine.store.commands import cmd_replay
from engine.store.transfer import export_run, import_run
from tests.store.helpers import CONFIG, FaultyDb, padded, wait_until

FAULTS = {"read-only": "read-only", "full": "full"}  # mode -> what ``fault`` says


def attempts_allowed(window_s, retry_s, max_retry_s):
    """Most attempts a backoff of retry_s, 2*retry_s, ... (capped) fits in window_s,
    counting the first one at time 0."""
    n, t, delay = 1, 0.0, retry_s
    while t + delay <= window_s:
        t += delay
        n += 1
        delay = min(max_retry_s, delay * 2)
    return n


def count_serialisations(monkeypatch):
    """The thread of every serialisation of a step (its JSON text, ``json_parts``)."""
    calls = []
    real = StepRecord.json_parts

    def json_parts(self):
        calls.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(StepRecord, "json_parts", json_parts)
    return calls


@pytest.mark.parametrize("mode", list(FAULTS))
def test_retries_back_off_and_each_step_is_serialised_once(tmp_path, monkeypatch, caplog, mode):
    path = str(tmp_path / "runs.sqlite")
    faulty = FaultyDb(monkeypatch)
    calls = count_serialisations(monkeypatch)
    rec = Recorder(path, retry_s=0.02, max_retry_s=0.16)
    run_id = rec.start_run(CONFIG)
    assert rec.flush(timeout=5) and faulty.connects == 1
    faulty.set(mode)
    window_s, n = 1.0, 0
    end = time.monotonic() + window_s
    while time.monotonic() < end:  # serving: a step every millisecond or so, for a second
        rec.record_step(padded(n))
        n += 1
        time.sleep(0.001)
    h = rec.health()
    assert FAULTS[mode] in h.fault and h.alive
    # One attempt per backoff slot, however many steps arrived (today: one per step).
    # The first failed attempt uses the open connection and each later one reopens, so
    # connects counts the attempts too. The bound holds on any machine speed: a slow
    # one fits fewer attempts in the window, never more.
    attempts = h.errors_total
    assert 2 <= attempts <= attempts_allowed(window_s, 0.02, 0.16) + 1
    assert faulty.connects in (attempts, attempts + 1)  # read just after: one more may have begun
    assert n >= 100 and h.backlog_steps > 0
    assert faulty.threads == {"kvscope-recorder"}  # serving threads never open the database
    faulty.set(None)
    assert rec.flush(timeout=5), rec.fault
    assert rec.healthy and rec.health().backlog_steps == 0
    assert len(calls) == n and set(calls) == {"kvscope-recorder"}  # once per step, off the engine
    assert [s.seq for s in RunStore(path).load_steps(run_id)] == list(range(n))
    errors = [r for r in caplog.records if r.name == "kvscope.store" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and FAULTS[mode] in errors[0].getMessage()
    assert rec.close(timeout=5)


@pytest.mark.parametrize("mode", list(FAULTS))
def test_backlog_drops_the_oldest_steps_and_the_run_says_so(tmp_path, monkeypatch, capsys, mode):
    path = str(tmp_path / "runs.sqlite")
    faulty = FaultyDb(monkeypatch)
    rec = Recorder(path, retry_s=0.01, max_retry_s=0.05, max_pending=20)
    run_id = rec.start_run(CONFIG, label="lossy")
    rec.record_step(padded(0))
    assert rec.flush(timeout=5)
    faulty.set(mode)
    for seq in range(1, 61):
        rec.record_step(padded(seq))
    rec.record_request("r1", "prompt", {"max_tokens": 1}, [{"text": "x"}])
    # 20 rows held at most: the request and the newest 19 steps; seq 1..41 dropped
    assert wait_until(lambda: rec.health().dropped_steps_total == 41)
    h = rec.health()
    assert (h.backlog_steps, h.dropped_steps_total, h.dropped_requests_total) == (19, 41, 0)
    assert FAULTS[mode] in h.fault and rec.dropped == 41
    faulty.set(None)
    rec.finish()
    assert rec.close(timeout=5)

    store = RunStore(path)
    assert [s.seq for s in store.load_steps(run_id)] == [0] + list(range(42, 61))
    assert [r["request_id"] for r in store.load_requests(run_id)] == ["r1"]
    [loss] = store.losses(run_id)
    assert (loss.first_seq, loss.last_seq, loss.first_step, loss.last_step) == (1, 41, 2, 42)
    assert (loss.num_steps, loss.num_requests) == (41, 0) and FAULTS[mode] in loss.reason
    [run] = store.list_runs()
    assert (run["lost_steps"], run["lost_requests"], run["num_steps"]) == (41, 0, 20)
    assert run["finished_at"] is not None
    assert store.state_at(run_id, 1).step == 1  # before the gap, replay works
    with pytest.raises(StepsLostError, match=r"41 steps lost here \(steps 2\.\.42.*up to step 1 only"):
        store.state_at(run_id)
    assert cmd_replay(argparse.Namespace(run_id=run_id, step=None, db=path)) == 1
    assert "41 steps lost here" in capsys.readouterr().err
    assert cmd_replay(argparse.Namespace(run_id=run_id, step=1, db=path)) == 0
    assert "note: 41 steps lost here" in capsys.readouterr().out
    copy = import_run(store, _export(store, run_id, tmp_path))
    assert [(x.first_seq, x.num_steps, x.reason) for x in store.losses(copy)] == \
        [(1, 41, loss.reason)]


def _export(store, run_id, tmp_path):
    out = tmp_path / "run.jsonl"
    assert export_run(store, run_id, out) == 1 + 20 + 1 + 1
    return out


def test_backlog_is_bounded_in_bytes_too(tmp_path, monkeypatch):
    path = str(tmp_path / "runs.sqlite")
    faulty = FaultyDb(monkeypatch)
    rec = Recorder(path, retry_s=0.05, max_retry_s=0.05, max_pending_bytes=5 * 2100)
    run_id = rec.start_run(CONFIG)
    assert rec.flush(timeout=5)
    faulty.set("read-only")
    for seq in range(30):
        rec.record_step(padded(seq))  # each row holds a little over 2000 characters of text
    assert wait_until(lambda: rec.health().dropped_steps_total == 25)
    assert (rec.health().backlog_steps, rec.health().dropped_steps_total) == (5, 25)
    faulty.set(None)
    assert rec.close(timeout=5)
    assert [s.seq for s in RunStore(path).load_steps(run_id)] == list(range(25, 30))


def test_requests_are_dropped_only_when_no_step_is_left(tmp_path, monkeypatch):
    path = str(tmp_path / "runs.sqlite")
    faulty = FaultyDb(monkeypatch)
    rec = Recorder(path, retry_s=0.05, max_retry_s=0.05, max_pending=3)
    run_id = rec.start_run(CONFIG)
    assert rec.flush(timeout=5)
    faulty.set("full")
    rec.record_step(padded(0))
    for i in range(5):
        rec.record_request(f"r{i}", "p" * 5000)
    assert wait_until(lambda: rec.health().dropped_requests_total == 2)
    h = rec.health()
    assert (h.dropped_steps_total, h.dropped_requests_total, h.backlog_steps) == (1, 2, 0)
    faulty.set(None)
    assert rec.close(timeout=5)
    store = RunStore(path)
    assert [r["request_id"] for r in store.load_requests(run_id)] == ["r2", "r3", "r4"]
    [loss] = store.losses(run_id)
    assert (loss.first_seq, loss.num_steps, loss.num_requests) == (0, 1, 2)
    assert "1 step lost here" in loss.describe() and "2 finished requests's rows lost" in loss.describe()

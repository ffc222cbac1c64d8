"""One row the database cannot store is skipped and counted; the recorder lives on."""

import logging

import pytest

from engine.events.schema.step import StepRecord
from engine.store import Recorder, RunStore
from engine.store import db as dbm
from tests.store.helpers import CONFIG, records

SURROGATE = "x\ud800"  # what json.loads makes of the frame text "x\\ud800"


def recorded(path, run_id):
    store = RunStore(path)
    run = store.get_run(run_id)
    return run, store.load_steps(run_id), {r["request_id"]: r for r in store.load_requests(run_id)}


def test_lone_surrogate_request_id_is_skipped_and_recording_goes_on(tmp_path, caplog):
    path = str(tmp_path / "runs.sqlite")
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG, label="bad id")
    first, *rest = records()
    rec.record_step(first)
    rec.record_request(SURROGATE, "hello", {"max_tokens": 2}, [{"text": "hi"}])
    assert rec.flush(timeout=5)  # the good rows of that batch are committed
    h = rec.health()
    assert h.alive and h.skipped_rows_total == 1 and h.fault is None and h.errors_total == 0
    assert "requests row" in h.last_error and "surrogates not allowed" in h.last_error
    for r in rest:  # later rows still go in
        rec.record_step(r)
    rec.record_request("good", "hello", {"max_tokens": 2}, [{"text": "hi"}])
    rec.finish()
    assert rec.close(timeout=5)
    run, steps, reqs = recorded(path, run_id)
    assert steps == records() and set(reqs) == {"good"}
    assert run["finished_at"] is not None
    assert rec.health().skipped_rows_total == 1 and rec.written == 1 + 3 + 1
    skips = [r for r in caplog.records if r.name == "kvscope.store" and "skipped" in r.getMessage()]
    assert len(skips) == 1 and skips[0].levelno == logging.ERROR


def test_every_kind_of_unstorable_row_is_skipped(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG)
    rec.record_step(StepRecord(0, 1, 10.0, [], {}))
    rec.record_step(StepRecord(1 << 64, 2, 10.5, [], {}))  # seq past SQLite's 64-bit INTEGER
    rec.record_step(StepRecord(1, 2, 10.5, [], {"obj": object()}))  # metrics that are not JSON
    rec.record_step(StepRecord(1, 2, 10.5, [], {"s": "\udfff", "n": 1 << 70}))  # JSON text: storable
    rec.record_step(StepRecord(2, 3, 11.0, [], {}))
    rec.record_request("p", prompt=SURROGATE)  # prompt text SQLite cannot encode as UTF-8
    rec.record_request("obj", params={"x": object()})  # not JSON: skipped, never raised at the caller
    rec.record_request("ok", prompt="fine")
    assert rec.close(timeout=5)
    _, steps, reqs = recorded(path, run_id)
    assert [s.seq for s in steps] == [0, 1, 2] and steps[1].metrics == {"s": "\udfff", "n": 1 << 70}
    assert set(reqs) == {"ok"}
    h = rec.health()
    assert (h.skipped_rows_total, h.backlog_steps, h.written_rows_total) == (4, 0, 1 + 3 + 1)
    assert not h.alive  # closed
    assert "requests row" in h.last_error and "TypeError" in h.last_error


def test_a_row_the_checks_miss_is_found_by_writing_row_by_row(tmp_path, monkeypatch):
    path = str(tmp_path / "runs.sqlite")
    monkeypatch.setattr(dbm, "check_row", lambda row: 0)  # as if check_row had a blind spot
    rec = Recorder(path)
    run_id = rec.start_run(CONFIG)
    for r in records():
        rec.record_step(r)
    rec.record_request(SURROGATE, "p")
    rec.record_request("ok", "p")
    assert rec.close(timeout=5)
    _, steps, reqs = recorded(path, run_id)
    assert steps == records() and set(reqs) == {"ok"}
    h = rec.health()
    assert (h.skipped_rows_total, h.errors_total, h.written_rows_total) == (1, 0, 1 + 3 + 1)


def test_an_unexpected_writer_error_costs_a_retry_not_the_recorder(tmp_path, monkeypatch):
    path = str(tmp_path / "runs.sqlite")
    real = dbm.insert_rows
    calls = []

    def flaky(db, table, rows):
        calls.append(table)
        if len(calls) == 1:
            raise KeyError("a bug in the writer")
        return real(db, table, rows)

    monkeypatch.setattr(dbm, "insert_rows", flaky)
    rec = Recorder(path, retry_s=0.01)
    run_id = rec.start_run(CONFIG)
    for r in records():
        rec.record_step(r)
    assert rec.flush(timeout=5) is False  # the first attempt hit the bug
    assert rec.health().alive and "KeyError" in rec.health().last_error
    assert rec.close(timeout=5)  # the retry at close commits everything
    assert recorded(path, run_id)[1] == records()
    assert rec.health().errors_total == 1


@pytest.mark.parametrize("n,expect", [(1, True), (10, True), (100, True), (2, False), (11, False),
                                      (110, False)])
def test_skip_log_lines_are_decades(n, expect):
    from engine.store.recorder import _decade

    assert _decade(n) is expect

"""Recording, loading, listing, labelling, deleting, export/import and snapshot_at."""

import sqlite3

import pytest

from engine.events.folds.reducer import PoolState
from engine.store import Recorder, RunStore, StepOutOfRangeError, UnknownRunError
from engine.store.db import resolve_db_path
from engine.store.transfer import export_run, import_run
from tests.store.helpers import CONFIG, records


def record_run(path, label="demo"):
    with Recorder(path) as rec:
        run_id = rec.start_run(CONFIG, model="tiny", label=label)
        for r in records():
            rec.record_step(r)
        rec.record_request("a", "hello", {"max_tokens": 2}, [{"text": "hi", "token_ids": [9, 7]}],
                           {"ttft_s": 0.1}, source="openai")
        rec.finish()
        assert rec.flush()
        assert rec.healthy and rec.fault is None
    return run_id


def test_run_steps_requests_round_trip(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    run_id = record_run(path)
    store = RunStore(path)
    [run] = store.list_runs()
    assert (run["id"], run["label"], run["model"], run["config"]) == (run_id, "demo", "tiny", CONFIG)
    assert (run["num_steps"], run["num_requests"]) == (3, 1)
    assert run["finished_at"] >= run["started_at"] > 0
    assert store.load_steps(run_id) == records()
    assert store.load_steps(run_id, upto_step=2) == records()[:2]
    [req] = store.load_requests(run_id)
    assert (req["request_id"], req["prompt"], req["params"], req["outputs"], req["timings"]) == \
        ("a", "hello", {"max_tokens": 2}, [{"text": "hi", "token_ids": [9, 7]}], {"ttft_s": 0.1})
    assert req["source"] == "openai"
    with sqlite3.connect(path) as c:
        assert c.execute("pragma journal_mode").fetchone()[0] == "wal"


def test_snapshot_at_replays_from_the_empty_pool(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    run_id = record_run(path)
    store = RunStore(path)
    expect = PoolState(4, 4)
    for r in records()[:2]:
        expect.apply_step(r)
    snap = store.snapshot_at(run_id, 2)
    assert snap == expect.to_snapshot() and snap.step == 2
    assert snap.requests["a"].block_table == (0, 1)
    last = store.snapshot_at(run_id)
    assert last.step == 3 and set(last.requests) == {"b"}
    assert last.free_queue == (1, 3, 0)
    assert store.metrics_at(run_id, 2) == {"kv_cache_usage": 0.75}
    with pytest.raises(StepOutOfRangeError, match="steps 1..3"):
        store.snapshot_at(run_id, 4)
    with pytest.raises(UnknownRunError, match="no run 'nope'"):
        store.snapshot_at("nope", 1)


def test_label_delete_and_export_import(tmp_path):
    path = str(tmp_path / "runs.sqlite")
    store = RunStore(path)
    run_id = record_run(path)
    store.label_run(run_id, "renamed")
    assert store.get_run(run_id)["label"] == "renamed"

    out = tmp_path / "run.jsonl"
    assert export_run(store, run_id, out) == 1 + 3 + 1
    new_id = import_run(store, out, label="copy")
    assert new_id != run_id
    assert store.load_steps(new_id) == store.load_steps(run_id)
    assert store.load_requests(new_id)[0]["outputs"] == store.load_requests(run_id)[0]["outputs"]
    assert store.load_requests(new_id)[0]["source"] == "openai"
    assert store.snapshot_at(new_id, 3) == store.snapshot_at(run_id, 3)
    assert {r["label"] for r in store.list_runs()} == {"renamed", "copy"}

    store.delete_run(run_id)
    assert [r["id"] for r in store.list_runs()] == [new_id]
    with sqlite3.connect(path) as c:
        assert c.execute("select count(*) from steps where run_id = ?", [run_id]).fetchone()[0] == 0
    for call in (lambda: store.delete_run(run_id), lambda: store.label_run(run_id, "x"),
                 lambda: store.load_steps(run_id)):
        with pytest.raises(UnknownRunError):
            call()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "step"}\n')
    with pytest.raises(ValueError, match="not a kvscope run export"):
        import_run(store, bad)


def test_default_path_env_override_and_creation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVSCOPE_DB", raising=False)
    assert resolve_db_path() == "data/runs.sqlite"
    assert RunStore().list_runs() == []
    assert (tmp_path / "data" / "runs.sqlite").exists()
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "deep" / "x" / "k.sqlite"))
    assert RunStore().list_runs() == []
    assert (tmp_path / "deep" / "x" / "k.sqlite").exists()


def test_recorder_validates_config_and_run(tmp_path):
    with Recorder(str(tmp_path / "r.sqlite")) as rec:
        with pytest.raises(ValueError, match="num_blocks"):
            rec.start_run({"block_size": 4})
        with pytest.raises(ValueError, match="start_run"):
            rec.record_step(records()[0])
    with pytest.raises(RuntimeError, match="closed"):
        rec.record_step(records()[0], run_id="x")


def test_a_file_from_before_sources_gets_the_column(tmp_path):
    path = str(tmp_path / "old.sqlite")
    with sqlite3.connect(path) as c:  # the requests table as it was before sources
        c.execute("create table requests (run_id text, request_id text, prompt text, params text, "
                  "outputs text, timings text, primary key (run_id, request_id))")
        c.execute("insert into requests values ('r', 'a', 'p', '{}', '[]', '{}')")
    store = RunStore(path)
    with store.db() as d:
        assert "source" in d["requests"].columns_dict
        assert [row["source"] for row in d["requests"].rows] == [None]

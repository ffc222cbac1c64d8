"""Replay's loader folds stored steps exactly as RunStore does, from any checkpoint."""

from __future__ import annotations

import dataclasses

import pytest

from engine.store.runs import RunStore

from dashboard import stored_runs
from dashboard.run_summary import compare_rows, config_rows, summarize_run
from dashboard.stored_runs import StoredRun
from tests.dashboard.fake_runs import record_run


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("replay") / "runs.sqlite")
    run_id = record_run(db, label="pressure", num_blocks=20)
    store = RunStore(db)
    sr = StoredRun(store.get_run(run_id), store.load_steps(run_id), store.load_requests(run_id))
    return store, run_id, sr


def test_state_after_every_step_matches_the_store(stored, monkeypatch):
    store, run_id, sr = stored
    monkeypatch.setattr(stored_runs, "CHECKPOINT_EVERY", 4)  # exercise checkpoints
    order = list(range(len(sr.records)))
    for i in order[::-1] + order:  # backwards first: checkpoints are made out of order
        want = store.snapshot_at(run_id, sr.records[i].step)
        got = dataclasses.replace(sr.state_after(i).to_snapshot(), step=want.step)
        assert got == want, f"step {sr.records[i].step}"


def test_frame_and_jumps(stored):
    _, _, sr = stored
    f = sr.frame(0)
    assert f.source == "replay" and f.step == sr.records[0].step and len(f.history) == 1
    # the contiguous baseline's input: the whole run's schedule, every request's max_tokens
    reqs = f.schedule.requests
    assert reqs and all(r.max_tokens for r in reqs if r.parent_id is None)
    assert f.schedule.last_step == sr.records[-1].step
    assert len(f.schedule_history) == len(sr.records)
    for kind, cls in stored_runs.JUMPS.items():
        hits = [i for i, r in enumerate(sr.records) if any(type(e) is cls for e in r.events)]
        assert hits, f"the pressure run has a {kind}"
        assert sr.next_index(-1, kind) == hits[0]
        assert sr.next_index(hits[0], kind) == (hits[1] if len(hits) > 1 else None)
        assert sr.next_index(hits[0], kind, backwards=True) in (None, *hits)


def test_run_summary_and_compare_rows(stored):
    _, _, sr = stored
    s = summarize_run([r.metrics for r in sr.records], len(sr.requests))
    assert s["steps"] == len(sr.records) and s["preemptions"] > 0 and s["evictions"] > 0
    rows = compare_rows(s, {**s, "steps": s["steps"] + 2})
    steps = next(r for r in rows if r["figure"] == "steps")
    assert steps["B − A"] == "2"
    cfg = config_rows(sr.config, {**sr.config, "block_size": 8})
    assert [r["setting"] for r in cfg if r["differs"]] == ["block_size"]

"""LiveFeed keeps the whole live run: new steps from the client's window, gaps from SQLite."""

from __future__ import annotations

from types import SimpleNamespace

from engine.events.reducer import PoolState
from engine.store.runs import RunStore

from dashboard.live_feed import LiveFeed
from tests.dashboard.fake_runs import record_run


def _view(run_id, records, upto, window=5, config=None):
    """What LiveConnection.view() shows after step record ``upto`` (a bounded window)."""
    shown = records[max(0, upto - window + 1):upto + 1]
    state = PoolState(config["num_blocks"], config["block_size"])
    for r in records[:upto + 1]:
        state.apply_step(r)
    return SimpleNamespace(run_id=run_id, seq=records[upto].seq, state=state.to_snapshot(),
                           config=config, metrics=records[upto].metrics,
                           recent_steps=[{"type": "step", **r.to_dict()} for r in shown])


def test_feed_fills_gaps_from_the_recording_and_resets_on_a_new_run(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db, num_blocks=20)
    store = RunStore(db)
    records = store.load_steps(run_id)
    config = store.get_run(run_id)["config"]
    feed = LiveFeed(store)
    feed.note_submission("sys-0", {"max_tokens": 6})

    got = feed.poll(_view(run_id, records, 3, config=config))
    assert [r.seq for r in got] == [r.seq for r in records[:4]]
    # the client's window scrolled past steps 4..9 between two polls
    last = len(records) - 1
    got = feed.poll(_view(run_id, records, last, window=3, config=config))
    assert [r.seq for r in got] == [r.seq for r in records] and feed.missing_steps == 0

    frame = feed.frame(_view(run_id, records, last, config=config), got)
    assert frame.source == "live" and frame.events == records[-1].events
    assert len(frame.history) == len(records) and frame.max_tokens == {"sys-0": 6}

    other = record_run(db, num_blocks=48)  # a restart: a new run id
    others = store.load_steps(other)
    assert [r.seq for r in feed.poll(_view(other, others, 1, config=config))] == [0, 1]


def test_feed_without_a_recording_counts_lost_steps(tmp_path):
    store = RunStore(str(tmp_path / "empty.sqlite"))
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db, num_blocks=20)
    src = RunStore(db)
    records, config = src.load_steps(run_id), src.get_run(run_id)["config"]
    feed = LiveFeed(store)  # looks in the wrong database: nothing to fill with
    feed.poll(_view(run_id, records, 1, config=config))
    got = feed.poll(_view(run_id, records, 10, window=2, config=config))
    assert feed.missing_steps == 7 and [r.seq for r in got][-2:] == [9, 10]

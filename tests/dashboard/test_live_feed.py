"""LiveFeed keeps the whole live run: new steps from the client's window, gaps from the
server (steps_since), never from the database's tables."""

from __future__ import annotations

import time
from types import SimpleNamespace

from engine.client import KVScopeClient, LiveConnection, ServerError
from engine.events.folds.reducer import PoolState
from engine.store.runs import RunStore

from dashboard.live_feed import LiveFeed
from tests.dashboard.fake_runs import record_run
from tests.server.conftest import db_path, make_server, tiny_llama  # noqa: F401 (fixtures)
from tests.server.helpers import GREEDY


def _view(run_id, records, upto, window=5, config=None, folded=None):
    """What LiveConnection.view() shows after step record ``upto`` (a bounded window);
    ``folded``: the state stopped at that record instead (resyncing: steps run ahead)."""
    shown = records[max(0, upto - window + 1):upto + 1]
    folded = upto if folded is None else folded
    state = PoolState(config["num_blocks"], config["block_size"])
    for r in records[:folded + 1]:
        state.apply_step(r)
    snap = state.to_snapshot()
    return SimpleNamespace(run_id=run_id, seq=records[folded].seq, state=snap,
                           config=config, metrics=records[upto].metrics, recent_steps=shown)


def _server_like(store: RunStore):
    """What the server answers to steps_since for a recorded run (its recording part)."""
    asked = []

    def steps_since(run_id, seq, until):
        asked.append((run_id, seq, until))
        return store.steps_after(run_id, seq)

    return steps_since, asked


def test_feed_fills_gaps_from_the_server_and_resets_on_a_new_run(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db, num_blocks=20)
    store = RunStore(db)
    records = store.load_steps(run_id)
    config = store.get_run(run_id)["config"]
    steps_since, asked = _server_like(store)
    feed = LiveFeed(steps_since)
    feed.note_submission("sys-0", {"max_tokens": 6})

    got = feed.poll(_view(run_id, records, 3, config=config))
    assert [r.seq for r in got] == [r.seq for r in records[:4]] and not asked
    # the client's window scrolled past steps 4..9 between two polls
    last = len(records) - 1
    got = feed.poll(_view(run_id, records, last, window=3, config=config))
    assert [r.seq for r in got] == [r.seq for r in records] and feed.missing_steps == 0
    assert asked == [(run_id, 3, last - 3)]  # only the gap was asked for

    frame = feed.frame(_view(run_id, records, last, config=config), got)
    assert frame.source == "live" and frame.events == records[-1].events
    assert len(frame.history) == len(records)
    assert {r.request_id: r.max_tokens for r in frame.schedule.requests}["sys-0"] == 6

    other = record_run(db, num_blocks=48)  # a restart: a new run id
    others = store.load_steps(other)
    assert [r.seq for r in feed.poll(_view(other, others, 1, config=config))] == [0, 1]


def test_feed_without_the_steps_on_the_server_counts_lost_steps(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db, num_blocks=20)
    src = RunStore(db)
    records, config = src.load_steps(run_id), src.get_run(run_id)["config"]

    def refused(run_id, seq, until):  # e.g. a server that recorded nothing of this run
        raise ServerError("unknown_run", "not here", op="steps_since")

    for steps_since in (lambda run_id, seq, until: [], refused):
        feed = LiveFeed(steps_since)
        feed.poll(_view(run_id, records, 1, config=config))
        got = feed.poll(_view(run_id, records, 10, window=2, config=config))
        assert feed.missing_steps == 7 and [r.seq for r in got][-2:] == [9, 10]


def test_live_feed_fills_its_gap_through_a_real_connection(make_server):  # noqa: F811
    # A client window of 3 steps, many steps between two polls: the feed asks the
    # server for the rest and ends up with exactly the run's steps.
    server = make_server(step_history=8)  # and the server's own buffer is small: SQLite too
    live = LiveConnection(server.url, recent_steps=3, retry_s=0.1).start()
    try:
        assert live.wait_live(30)
        feed = LiveFeed(lambda run_id, seq, until: live.steps_since(seq, run_id, until=until))
        assert feed.poll(live.view()) == []
        with KVScopeClient(server.url, timeout=30) as c:
            for i in range(4):
                c.generate(f"prompt {i}", params=GREEDY)
            last = c.snapshot().seq
        deadline = time.monotonic() + 30
        while live.view().seq != last:
            assert time.monotonic() < deadline, "the live view did not catch up"
            time.sleep(0.02)
        view = live.view()
        assert len(view.recent_steps) == 3 and last > 3 + 8  # window and buffer both short
        assert server.recorder.flush(30)
        got = feed.poll(view)
        stored = RunStore(server.options.db).load_steps(server.health.run_id)
        assert [r.to_dict() for r in got] == [r.to_dict() for r in stored]
        assert [r.seq for r in got] == list(range(last + 1)) and feed.missing_steps == 0
    finally:
        live.stop()


def test_every_part_of_a_live_frame_is_of_one_step_or_the_frame_is_dropped(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    run_id = record_run(db, num_blocks=20)
    store = RunStore(db)
    records, config = store.load_steps(run_id), store.get_run(run_id)["config"]
    feed = LiveFeed(lambda run_id, seq, until: [])
    shown = []
    for upto in range(len(records)):
        view = _view(run_id, records, upto, config=config)
        frame = feed.frame(view, feed.poll(view))
        step = records[upto].step
        # pool, KPI metrics, events and the contiguous baseline: all of this one step
        assert frame.consistent and frame.step == step == frame.metrics["step"]
        assert frame.events == records[upto].events and frame.schedule.last_step == step
        shown.append(frame)
    assert feed.dropped_frames == 0
    # a resync: steps 11.. arrived while the state still stands at step record 10
    feed = LiveFeed(lambda run_id, seq, until: [])
    good = feed.frame(_view(run_id, records, 10, config=config),
                      feed.poll(_view(run_id, records, 10, config=config)))
    ahead = _view(run_id, records, 14, config=config, folded=10)
    again = feed.frame(ahead, feed.poll(ahead))
    assert again is good and feed.dropped_frames == 1  # the old frame, not a mix
    # the feed lost the shown step but the view has its metrics (a snapshot's): drawn,
    # its events marked unknown and no baseline (it would end short of the step)
    feed = LiveFeed(lambda run_id, seq, until: [])
    feed.poll(_view(run_id, records, 3, config=config))
    jump = _view(run_id, records, 12, window=0, config=config)
    lost = feed.frame(jump, feed.poll(jump))
    assert lost.consistent and not lost.events_known and lost.events == []
    assert lost.step == records[12].step == lost.metrics["step"] and lost.schedule is None
    assert feed.missing_steps == 9
    # and a view whose metrics are of another step than its state: dropped
    bad = SimpleNamespace(**{**vars(jump), "metrics": records[11].metrics})
    assert feed.frame(bad, feed.poll(bad)) is lost

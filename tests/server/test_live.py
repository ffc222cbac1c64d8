"""LiveConnection: the dashboard's background view of a live server."""

import time

import pytest

from engine.client import KVScopeClient, LiveConnection, ServerError
from engine.events.folds.reducer import PoolState
from engine.events.schema.step import StepRecord
from engine.protocol import Hello, Snapshot, Step
from tests.server.conftest import Gate
from tests.server.helpers import GREEDY


def _until(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_live_connection_follows_the_engine(make_server):
    gate = Gate()
    server = make_server(ready=False, engine_factory=gate)
    live = LiveConnection(server.url, retry_s=0.1).start()
    try:
        _until(lambda: live.view().status == "loading")
        gate.open()
        assert live.wait_live(30)
        v = live.view()
        assert v.run_id == server.health.run_id and v.config["num_blocks"] == 64
        assert v.state.num_blocks == 64 and v.seq == -1
        rid = live.submit("follow me", params=GREEDY)
        _until(lambda: live.outputs(rid).finished is not None)
        p = live.outputs(rid)
        assert p.texts[0] == p.finished.outputs[0]["text"]
        assert p.token_ids[0] == p.finished.outputs[0]["token_ids"]
        with pytest.raises(ServerError) as err:
            live.submit("x", params={"temperature": -1})
        assert err.value.code == "bad_params"
        # The folded state equals the engine's own snapshot once idle.
        with KVScopeClient(server.url, timeout=20) as other:
            other.generate("from another client", params=GREEDY)
            fresh = other.snapshot()
        _until(lambda: live.view().seq == fresh.seq)
        v = live.view()
        assert v.state == fresh.state and v.status == "live"
        assert len(v.metrics_history) == len(v.recent_steps) == fresh.seq + 1
        assert v.metrics["step"] == fresh.state.step
        # A missed step (simulated: the server only drops steps for stalled sockets,
        # see test_stalled) makes it re-base from a snapshot.
        with live._changed:
            ask = live._live.apply(Step(StepRecord(v.seq + 5, 999, 0.0)))
        assert ask and live.view().status == "resyncing"
        live.request_snapshot()
        _until(lambda: live.view().status == "live" and live.view().num_gaps == 1)
        assert live.view().state == fresh.state
        assert live.reset_prefix_cache().op == "reset_prefix_cache"
        # restart: a new run, history starts again
        old_run = live.view().run_id
        result = live.restart({"num_kv_blocks": 32})
        assert result.result["previous_run_id"] == old_run
        _until(lambda: live.view().run_id == result.result["run_id"]
               and live.view().state is not None and live.view().state.num_blocks == 32)
    finally:
        live.stop()
    assert live.view().status == "stopped"


def test_live_connection_reconnects_after_the_server_goes(make_server):
    server = make_server()
    live = LiveConnection(server.url, retry_s=0.1).start()
    try:
        assert live.wait_live(30)
        server.stop()
        _until(lambda: live.view().status in ("disconnected", "connecting"))
        assert live.view().errors
    finally:
        live.stop()


def _step(seq, events=(), step=None):
    return Step(StepRecord(seq, step if step is not None else seq + 1, 0.0, list(events), {"seq": seq}))


def _empty(num_blocks, block_size):
    return PoolState(num_blocks, block_size).to_snapshot()


def test_live_state_gaps_stale_steps_and_new_runs():
    from engine.client.live_state import LiveState

    s = LiveState(history=3)
    s.apply(Hello(1, "r1", {}))
    s.apply(Snapshot(4, _empty(4, 2), {}))
    assert s.view().status == "live" and s.seq == 4
    assert not s.apply(_step(3))  # older than the snapshot: ignored
    assert not s.apply(_step(5, [{"type": "request_arrived", "step": 6, "request_id": "a",
                                  "num_prompt_tokens": 1, "prompt_token_ids": [7]}]))
    assert s.seq == 5 and "a" in s.view().state.requests
    assert s.apply(_step(8))  # gap: ask for a snapshot, once
    assert not s.apply(_step(9)) and s.view().status == "resyncing" and s.gaps == 1
    assert s.view().state.requests.keys() == {"a"}  # stale but consistent as of seq 5
    s.apply(Snapshot(9, _empty(4, 2)))
    assert s.view().status == "live" and s.view().state.requests == {}
    assert [m["seq"] for m in s.view().metrics_history] == [5, 8, 9]  # bounded to 3
    s.apply(Hello(1, "r2", {}))  # restart: a new run
    assert s.view().metrics_history == [] and s.view().state is None
    # a step the reducer cannot apply drops the state until the next snapshot
    s.apply(Snapshot(-1, _empty(4, 2)))
    assert s.apply(_step(0, [{"type": "block_freed", "step": 1, "block": 0, "request_id": "x",
                              "ref_count": 0}]))
    assert s.state is None and s.view().status == "resyncing"

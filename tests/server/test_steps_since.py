"""steps_since: a client that missed steps gets them from the server, out of its step
buffer, or out of the run's recording when they are older (or of another run)."""

from __future__ import annotations

import asyncio

import pytest

from engine.client import KVScopeClient, ServerError
from engine.events.schema.step import StepRecord
from engine.protocol import StepsSince
from engine.server.websocket.step_history import MAX_STEPS_PER_REPLY, StepHistory
from tests.server.helpers import GREEDY, raw, recv_until, send

LONG = {"temperature": 0.0, "max_tokens": 60, "ignore_eos": True}


def _dicts(records):
    return [r.to_dict() for r in records]


def _all_steps(c: KVScopeClient) -> list[StepRecord]:
    c.poll(0.3)  # the last steps of an idle engine
    return c.drain_steps()


def test_a_gap_is_filled_from_the_step_buffer(make_server):
    server = make_server(record=False)
    with KVScopeClient(server.url, timeout=30) as c:
        for i in range(3):
            c.generate(f"prompt {i}", params=GREEDY)
        seen = _all_steps(c)
        assert [s.seq for s in seen] == list(range(len(seen))) and len(seen) > 10
        assert _dicts(c.steps_since(4)) == _dicts(seen[5:])
        assert _dicts(c.steps_since(-1)) == _dicts(seen)
        assert c.steps_since(seen[-1].seq) == []
        # nothing recorded and not the live run: the server says so
        with pytest.raises(ServerError) as err:
            c.steps_since(-1, run_id="20000101-000000-000000")
        assert err.value.code == "unknown_run"


def test_older_steps_come_from_the_recording_across_replies(make_server):
    server = make_server(step_history=4)  # the buffer keeps 4: the rest is read from SQLite
    with KVScopeClient(server.url, timeout=60) as c:
        for i in range(9):  # ~550 steps: more than one reply's worth
            c.generate(f"long {i}", params=LONG)
        seen = _all_steps(c)
        assert len(seen) > MAX_STEPS_PER_REPLY + 4
        assert server.recorder.flush(30)
        assert _dicts(c.steps_since(-1)) == _dicts(seen)  # two replies: the first says "more"
        assert _dicts(c.steps_since(100)) == _dicts(seen[101:])
        # on the wire: one reply is bounded, in seq order, and says there is more
        ws = raw(server.url)
        send(ws, type="steps_since", seq=-1)
        reply, _ = recv_until(ws, lambda m: m["type"] == "steps")
        assert reply["run_id"] == c.run_id and reply["since"] == -1 and reply["more"] is True
        assert [s["seq"] for s in reply["steps"]] == list(range(MAX_STEPS_PER_REPLY))
        assert reply["steps"][7] == seen[7].to_dict()
        ws.close()
        # a finished run's steps, by its id, after a restart
        old_run = c.run_id
        c.restart({"num_kv_blocks": 32})
        assert c.run_id != old_run and c.steps_since(-1) == []  # the new run has no steps yet
        assert server.recorder.flush(30)
        assert _dicts(c.steps_since(-1, run_id=old_run)) == _dicts(seen)
        with pytest.raises(ServerError) as err:
            c.steps_since(-1, run_id="no-such-run")
        assert err.value.code == "unknown_run"


def test_steps_neither_buffered_nor_recorded_are_absent(make_server):
    server = make_server(record=False, step_history=4)
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("one", params=GREEDY)
        seen = _all_steps(c)
        assert len(seen) > 4
        assert _dicts(c.steps_since(-1)) == _dicts(seen[-4:])  # the client sees the gap


def _records(n: int) -> list[StepRecord]:
    return [StepRecord(i, i + 1, float(i)) for i in range(n)]


def test_history_bounds_each_reply_and_follows_the_live_run():
    h = StepHistory(capacity=1000)
    for r in _records(600):
        h.append("run-a", r)
    first = asyncio.run(h.answer(StepsSince(-1)))
    assert first.run_id == "run-a" and first.more
    assert [r.seq for r in first.steps] == list(range(MAX_STEPS_PER_REPLY))
    rest = asyncio.run(h.answer(StepsSince(first.steps[-1].seq)))
    assert [r.seq for r in rest.steps] == list(range(MAX_STEPS_PER_REPLY, 600)) and not rest.more
    h.append("run-b", StepRecord(0, 1, 0.0))  # a new run replaces the old run's buffer
    assert [r.seq for r in asyncio.run(h.answer(StepsSince(-1))).steps] == [0]
    err = asyncio.run(h.answer(StepsSince(-1, "run-a")))  # not live, nothing recorded
    assert err.code == "unknown_run" and err.op == "steps_since"


def test_one_steps_since_at_a_time_per_connection():
    # Each may read the database: a second one while the first is answered is refused.
    from engine.protocol import decode_message
    from engine.server.websocket.hub import Hub, HubLimits
    from engine.server.worker.mailbox import Mailbox
    from engine.server.websocket.outbox import Outbox
    from engine.server.metrics.prom import ServerMetrics
    from engine.server.websocket.ws_connection import ClientConn

    hub = Hub(Mailbox(8), ServerMetrics("tiny"), HubLimits())
    conn = ClientConn(1, None, Outbox(8, 1 << 20), hub.metrics)
    hub.history.append("run-a", StepRecord(0, 1, 0.0))

    async def go():
        release = asyncio.Event()
        answer = hub.history.answer

        async def slow(op):
            await release.wait()
            return await answer(op)

        hub.history.answer = slow
        hub._on_frame(conn, '{"type": "steps_since", "seq": -1}')
        hub._on_frame(conn, '{"type": "steps_since", "seq": -1}')
        busy = decode_message(await conn.outbox.get())
        release.set()
        steps = decode_message(await conn.outbox.get())
        hub._on_frame(conn, '{"type": "steps_since", "seq": 0}')  # free again
        again = decode_message(await conn.outbox.get())
        return busy, steps, again

    busy, steps, again = asyncio.run(go())
    assert (busy.type, busy.code, busy.op) == ("error", "busy", "steps_since")
    assert steps.type == "steps" and [r.seq for r in steps.steps] == [0]
    assert again.type == "steps" and again.steps == [] and again.since == 0

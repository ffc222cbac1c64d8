"""Pure parts of the server: op parsing, typed round trips, outboxes, the mailbox,
the one-hierarchy dispatch, security checks."""

import asyncio
import json

import pytest

from engine.core.sampling_params import SamplingParams
from engine.events.folds.reducer import PoolState
from engine.events.schema import types as event_types
from engine.events.schema.step import StepRecord
from engine.protocol import (
    Abort, AbortAll, Accepted, Error, Finished, Hello, Ok, Output, Ping, Pong, ProtocolError,
    ResetPrefixCache, Restart, Snapshot, Step, Steps, StepsSince, Submit, TakeSnapshot,
    decode_message, encode, parse_op,
)
from engine.protocol.messages import MESSAGES
from engine.protocol.ops import OPS
from engine.server.websocket.hub import Hub, HubLimits
from engine.server.worker.mailbox import Detach, Letter, Mailbox
from engine.server.websocket.outbox import Outbox
from engine.server.metrics.prom import ServerMetrics
from engine.server.port.security import BindRefused, check_bind, token_ok
from engine.server.websocket.ws_connection import ClientConn


def test_ops_parse_with_type_or_op():
    assert parse_op('{"type": "ping"}') == Ping()
    assert parse_op('{"op": "snapshot"}') == TakeSnapshot()
    op = parse_op(json.dumps({"type": "submit", "prompt": [1, 2], "params": {"n": 2},
                              "request_id": "a"}))
    assert op == Submit(prompt=[1, 2], params=SamplingParams(n=2), request_id="a")
    op = parse_op(json.dumps({"op": "submit", "messages": [{"role": "user", "content": "hi"}]}))
    assert op.messages == [{"role": "user", "content": "hi"}] and op.request_id is None
    op = parse_op('{"type": "restart", "engine": {"num_kv_blocks": 8}}')
    assert op == Restart({"num_kv_blocks": 8})
    assert parse_op('{"type": "abort", "request_id": "x"}') == Abort("x")
    assert parse_op('{"type": "steps_since", "seq": 3, "run_id": "r"}') == StepsSince(3, "r")
    assert parse_op('{"type": "steps_since", "seq": -1}') == StepsSince(-1)


@pytest.mark.parametrize("frame, code", [
    ("nope", "bad_json"),
    ("[1, 2]", "bad_json"),
    ("[" * 100_000, "bad_json"),  # nesting past the recursion limit is still just bad JSON
    ('{"type": "frobnicate"}', "unknown_op"),
    ("{}", "unknown_op"),
    ('{"type": "submit"}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "messages": []}', "bad_request"),
    ('{"type": "submit", "prompt": [1, "2"]}', "bad_request"),
    ('{"type": "submit", "prompt": [true]}', "bad_request"),
    ('{"type": "submit", "messages": [{"role": "user"}]}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "params": 3}', "bad_params"),
    ('{"type": "submit", "prompt": "a", "params": {"top_p": 2}}', "bad_params"),
    ('{"type": "submit", "prompt": "a", "params": {"tempreature": 1}}', "bad_params"),
    ('{"type": "submit", "prompt": "a", "request_id": "a#1"}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "extra": 1}', "bad_request"),
    ('{"type": "submit", "prompt": ""}', "empty_prompt"),
    ('{"type": "submit", "prompt": []}', "empty_prompt"),
    ('{"type": "submit", "messages": [{"role": "user", "content": " "}]}', "empty_prompt"),
    ('{"type": "restart", "engine": {"n_shring": "cow"}}', "bad_config"),
    ('{"type": "abort"}', "bad_request"),
    ('{"type": "restart", "engine": {"model": "/etc/passwd"}}', "bad_config"),
    ('{"type": "restart", "engine": []}', "bad_config"),
    ('{"type": "steps_since"}', "bad_request"),
    ('{"type": "steps_since", "seq": "3"}', "bad_request"),
    ('{"type": "steps_since", "seq": true}', "bad_request"),
    ('{"type": "steps_since", "seq": -2}', "bad_request"),
    ('{"type": "steps_since", "seq": 0, "run_id": 7}', "bad_request"),
])
def test_bad_frames_name_their_error(frame, code):
    with pytest.raises(ProtocolError) as err:
        parse_op(frame)
    assert err.value.code == code and err.value.message


def test_submit_errors_carry_the_request_id():
    with pytest.raises(ProtocolError) as err:
        parse_op('{"type": "submit", "request_id": "r1"}')
    assert err.value.request_id == "r1" and err.value.op == "submit"
    with pytest.raises(ProtocolError) as err:  # the same check when a client builds the op
        Submit(prompt=None, request_id="r2")
    assert (err.value.code, err.value.request_id, err.value.op) == ("bad_request", "r2", "submit")
    with pytest.raises(ProtocolError) as err:  # refused before sending, with the server's code
        Submit(prompt="", request_id="r3")
    assert (err.value.code, err.value.request_id) == ("empty_prompt", "r3")


def test_messages_encode_with_their_type():
    assert json.loads(encode(Error("bad_json", "x"))) == {
        "type": "error", "code": "bad_json", "message": "x", "request_id": None, "op": None}
    assert json.loads(encode(Output("r", 0, "a", [1]))) == {
        "type": "output", "request_id": "r", "index": 0, "text_delta": "a", "token_ids": [1]}
    step = {"seq": 3, "step": 4, "ts": 1.0, "events": [], "metrics": {}}
    assert json.loads(encode(Step(StepRecord.from_dict(step)))) == {"type": "step", **step}
    assert encode(Step(StepRecord.from_dict(step))) == (
        '{"type":"step","seq":3,"step":4,"ts":1.0,"events":[],"metrics":{}}')


def _record(seq: int) -> StepRecord:
    return StepRecord(seq, seq + 1, 12.5, [
        event_types.RequestArrived(seq + 1, f"r{seq}", 2, (5, 6)),
        event_types.BlockAllocated(seq + 1, 3, f"r{seq}", 0),
    ], {"step": seq + 1, "kv_cache_usage": 0.25})


# One of every message, with its exact wire object: decode(encode(m)) == m for each.
MESSAGE_CASES = [
    (Hello(2, "run-1", {"num_blocks": 4, "block_size": 2}, {"max_n": 64}),
     {"type": "hello", "protocol": 2, "run_id": "run-1", "config": {"num_blocks": 4, "block_size": 2},
      "limits": {"max_n": 64}}),
    (Snapshot(-1, PoolState(2, 4).to_snapshot(), {}),
     {"type": "snapshot", "seq": -1, "state": PoolState(2, 4).to_snapshot().to_dict(), "metrics": {}}),
    (Step(_record(7)), {"type": "step", **_record(7).to_dict()}),
    (Steps("run-1", 5, [_record(6), _record(7)], True),
     {"type": "steps", "run_id": "run-1", "since": 5,
      "steps": [_record(6).to_dict(), _record(7).to_dict()], "more": True}),
    (Accepted("a"), {"type": "accepted", "request_id": "a"}),
    (Output("a", 1, "é", [9, 10]), {"type": "output", "request_id": "a", "index": 1,
                                    "text_delta": "é", "token_ids": [9, 10]}),
    (Finished("a", [{"index": 0, "text": "x", "token_ids": [1], "finish_reason": "length",
                     "stop_reason": None}], {"num_prompt_tokens": 3}),
     {"type": "finished", "request_id": "a", "outputs": [
         {"index": 0, "text": "x", "token_ids": [1], "finish_reason": "length", "stop_reason": None}],
      "metrics": {"num_prompt_tokens": 3}}),
    (Error("busy", "later", "a", "submit"),
     {"type": "error", "code": "busy", "message": "later", "request_id": "a", "op": "submit"}),
    (Ok("reset_prefix_cache", {"num_blocks_reset": 2}),
     {"type": "ok", "op": "reset_prefix_cache", "result": {"num_blocks_reset": 2}}),
    (Pong(1.5), {"type": "pong", "ts": 1.5}),
]


@pytest.mark.parametrize("msg, wire", MESSAGE_CASES, ids=lambda x: getattr(x, "type", ""))
def test_every_message_round_trips_typed(msg, wire):
    text = encode(msg)
    assert json.loads(text) == wire
    back = decode_message(text)
    assert type(back) is type(msg) and back == msg
    if isinstance(msg, (Step, Steps)):  # events come back typed, not as dicts
        records = [back.record] if isinstance(back, Step) else back.steps
        assert all(isinstance(e, event_types.Event) for r in records for e in r.events)


def test_the_cases_cover_every_message_and_op():
    assert {type(m) for m, _ in MESSAGE_CASES} == set(MESSAGES.values())
    assert {type(op) for op, _ in OP_CASES} == set(OPS.values())


OP_CASES = [
    (Submit(prompt="hi", params=SamplingParams(max_tokens=3), request_id="a"),
     {"type": "submit", "prompt": "hi", "params": SamplingParams(max_tokens=3).to_dict(),
      "request_id": "a"}),
    (Submit(messages=[{"role": "user", "content": "hi"}]),
     {"type": "submit", "messages": [{"role": "user", "content": "hi"}],
      "params": SamplingParams().to_dict()}),
    (Abort("a"), {"type": "abort", "request_id": "a"}),
    (AbortAll(), {"type": "abort_all"}),
    (TakeSnapshot(), {"type": "snapshot"}),
    (StepsSince(4, "run-1"), {"type": "steps_since", "seq": 4, "run_id": "run-1"}),
    (StepsSince(-1), {"type": "steps_since", "seq": -1}),
    (ResetPrefixCache(), {"type": "reset_prefix_cache"}),
    (Ping(), {"type": "ping"}),
    (Restart({"block_size": 8}), {"type": "restart", "engine": {"block_size": 8}}),
]


@pytest.mark.parametrize("op, wire", OP_CASES, ids=lambda x: getattr(x, "type", ""))
def test_every_op_round_trips_typed(op, wire):
    text = encode(op)
    assert json.loads(text) == wire
    assert parse_op(text) == op


def test_decoding_rejects_what_is_not_a_message():
    for frame in ('{"type": "nope"}', "[1]", '{"type": "accepted"}', '{"type": "step", "seq": 1}',
                  "not json"):
        with pytest.raises(ProtocolError):
            decode_message(frame)
    # fields a newer server adds are ignored, not fatal
    assert decode_message('{"type": "pong", "ts": 2.0, "new_field": 1}') == Pong(2.0)


def test_outbox_bounds_steps_and_sends_replies_first():
    async def go():
        box = Outbox(max_steps=2, max_bytes=6)
        assert box.put_step("s1") and box.put_step("s2")
        assert not box.put_step("s3") and box.dropped_steps == 1
        assert box.put_reply("r1")
        assert [await box.get() for _ in range(3)] == ["r1", "s1", "s2"]
        box.put_step("s4")
        box.clear_steps()  # a snapshot supersedes queued steps
        assert box.num_steps == 0 and box.max_steps_seen == 2
        assert box.put_reply("aa") and box.put_reply("bb") and not box.put_reply("ccc")

    asyncio.run(go())


def test_outbox_counts_bytes_drops_steps_for_replies_and_keeps_one_snapshot():
    async def go():
        box = Outbox(max_steps=100, max_bytes=10)
        assert box.put_step("s" * 4) and box.put_step("t" * 4) and box.num_bytes == 8
        assert not box.put_step("u" * 4) and box.dropped_steps == 1  # bytes, not the count
        # a reply that does not fit first drops the queued steps (droppable), then fits
        assert box.put_reply("r" * 6) and box.num_steps == 0 and box.dropped_steps == 3
        assert box.num_bytes == 6 and box.max_bytes_seen == 8
        assert not box.put_reply("x" * 5)  # replies are never dropped: the client must go
        assert await box.get() == "r" * 6 and box.num_bytes == 0
        # snapshots: an unsent older one is superseded, other replies keep their order
        assert box.put_reply("S1", snapshot=True) and box.put_reply("ok")
        assert box.put_reply("S2", snapshot=True)
        assert (box.num_snapshots, box.superseded_snapshots, box.num_bytes) == (1, 1, 4)
        assert [await box.get() for _ in range(2)] == ["ok", "S2"]
        # one frame bigger than the bound still goes out, alone
        assert box.put_reply("B" * 50, snapshot=True) and not box.put_reply("a")
        assert await box.get() == "B" * 50
        box.close()
        assert not box.put_reply("a") and not box.put_step("s") and box.num_bytes == 0

    asyncio.run(go())


def test_mailbox_bounds_ops_but_not_lifecycle():
    q = Mailbox(max_ops=2)
    assert q.send(None, TakeSnapshot()) and q.send(None, TakeSnapshot())
    assert not q.send(None, TakeSnapshot())
    q.send_lifecycle(None, Detach())  # always accepted
    assert len(q.take(block=False, limit=10)) == 3
    assert q.send(None, TakeSnapshot())
    assert q.take(block=False, limit=10) == [Letter(None, TakeSnapshot())]
    assert q.take(block=False, limit=10) == []
    assert len({q.new_sink_id() for _ in range(5)}) == 5


class _FakeWs:
    transport = None


def _hub_and_conn():
    mailbox = Mailbox(max_ops=16)
    hub = Hub(mailbox, ServerMetrics("tiny"), HubLimits())
    conn = ClientConn(mailbox.new_sink_id(), _FakeWs(), Outbox(8, 1 << 20), hub.metrics)
    return hub, mailbox, conn


def test_the_hub_posts_the_parsed_op_itself_with_the_connection_as_sink():
    # One hierarchy: the op the frame parses to is the command the engine thread
    # executes; the hub adds only the sink (this connection). No translation.
    frames = [
        json.dumps({"type": "submit", "prompt": [1, 2], "params": {"n": 2, "temperature": 0},
                    "request_id": "a"}),
        json.dumps({"type": "abort", "request_id": "a"}),
        json.dumps({"type": "snapshot"}),
        json.dumps({"type": "reset_prefix_cache"}),
        json.dumps({"type": "restart", "engine": {"num_kv_blocks": 8}}),
    ]
    hub, mailbox, conn = _hub_and_conn()
    for frame in frames:
        hub._on_frame(conn, frame)
    letters = mailbox.take(block=False, limit=100)
    assert letters == [Letter(conn, parse_op(f)) for f in frames]
    assert all(letter.sink is conn for letter in letters)
    assert isinstance(letters[0].command.params, SamplingParams)  # typed, validated once
    assert conn.outbox.num_replies == 0


def test_the_hub_answers_ping_and_bad_frames_itself():
    hub, mailbox, conn = _hub_and_conn()

    async def go():
        hub._on_frame(conn, '{"type": "ping"}')
        hub._on_frame(conn, '{"type": "submit", "prompt": "x", "params": {"n": 0}}')
        hub._on_frame(conn, b"\x00")
        return [decode_message(await conn.outbox.get()) for _ in range(3)]

    pong, bad_params, binary = asyncio.run(go())
    assert isinstance(pong, Pong) and bad_params.code == "bad_params" and binary.code == "binary_frame"
    assert mailbox.take(block=False, limit=10) == []  # none of them reached the engine thread
    hub.stopping = True
    hub._on_frame(conn, '{"type": "submit", "prompt": "x", "request_id": "late"}')
    assert mailbox.take(block=False, limit=10) == []
    late = decode_message(asyncio.run(conn.outbox.get()))
    assert (late.code, late.request_id, late.op) == ("shutting_down", "late", "submit")


def test_bind_policy():
    check_bind("127.0.0.1", False, None)
    check_bind("::1", False, None)
    check_bind("localhost", False, None)
    with pytest.raises(BindRefused, match="--allow-remote"):
        check_bind("0.0.0.0", False, "x" * 32)
    with pytest.raises(BindRefused, match="KVSCOPE_TOKEN"):
        check_bind("0.0.0.0", True, None)
    with pytest.raises(BindRefused, match="too short"):
        check_bind("192.168.1.5", True, "short")
    check_bind("0.0.0.0", True, "x" * 32)


def test_token_check():
    assert token_ok(None, "/", None)
    assert token_ok("sekrit", "/?token=sekrit", None)
    assert token_ok("sekrit", "/", "Bearer sekrit")
    assert not token_ok("sekrit", "/", None)
    assert not token_ok("sekrit", "/?token=nope", None)
    assert not token_ok("sekrit", "/", "Bearer nope")

"""Pure parts of the server: op parsing, outboxes, the command queue, security checks."""

import asyncio
import json

import pytest

from engine.server import engine_commands as C
from engine.server import protocol as P
from engine.server.outbox import Outbox
from engine.server.security import BindRefused, check_bind, token_ok


def test_ops_parse_with_type_or_op():
    assert P.parse_op('{"type": "ping"}') == P.PingOp()
    assert P.parse_op('{"op": "snapshot"}') == P.SnapshotOp()
    op = P.parse_op(json.dumps({"type": "submit", "prompt": [1, 2], "params": {"n": 2},
                                "request_id": "a"}))
    assert op == P.SubmitOp(prompt=[1, 2], params={"n": 2}, request_id="a")
    op = P.parse_op(json.dumps({"op": "submit", "messages": [{"role": "user", "content": "hi"}]}))
    assert op.messages == [{"role": "user", "content": "hi"}] and op.request_id is None
    op = P.parse_op('{"type": "restart", "engine": {"num_kv_blocks": 8}}')
    assert op == P.RestartOp({"num_kv_blocks": 8})
    assert P.parse_op('{"type": "abort", "request_id": "x"}') == P.AbortOp("x")


@pytest.mark.parametrize("frame, code", [
    ("nope", "bad_json"),
    ("[1, 2]", "bad_json"),
    ('{"type": "frobnicate"}', "unknown_op"),
    ("{}", "unknown_op"),
    ('{"type": "submit"}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "messages": []}', "bad_request"),
    ('{"type": "submit", "prompt": [1, "2"]}', "bad_request"),
    ('{"type": "submit", "prompt": [true]}', "bad_request"),
    ('{"type": "submit", "messages": [{"role": "user"}]}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "params": 3}', "bad_params"),
    ('{"type": "submit", "prompt": "a", "request_id": "a#1"}', "bad_request"),
    ('{"type": "submit", "prompt": "a", "extra": 1}', "bad_request"),
    ('{"type": "abort"}', "bad_request"),
    ('{"type": "restart", "engine": {"model": "/etc/passwd"}}', "bad_config"),
    ('{"type": "restart", "engine": []}', "bad_config"),
])
def test_bad_frames_name_their_error(frame, code):
    with pytest.raises(P.ProtocolError) as err:
        P.parse_op(frame)
    assert err.value.code == code and err.value.message


def test_submit_errors_carry_the_request_id():
    with pytest.raises(P.ProtocolError) as err:
        P.parse_op('{"type": "submit", "request_id": "r1"}')
    assert err.value.request_id == "r1" and err.value.op == "submit"


def test_messages_encode_with_their_type():
    assert json.loads(P.encode(P.Error("bad_json", "x"))) == {
        "type": "error", "code": "bad_json", "message": "x", "request_id": None, "op": None}
    assert json.loads(P.encode(P.Output("r", 0, "a", [1]))) == {
        "type": "output", "request_id": "r", "index": 0, "text_delta": "a", "token_ids": [1]}
    step = {"seq": 3, "step": 4, "ts": 1.0, "events": [], "metrics": {}}
    assert json.loads(P.step_frame(step)) == {"type": "step", **step}


def test_outbox_bounds_steps_and_sends_replies_first():
    async def go():
        box = Outbox(max_steps=2, max_replies=2)
        assert box.put_step("s1") and box.put_step("s2")
        assert not box.put_step("s3") and box.dropped_steps == 1
        assert box.put_reply("r1")
        assert [await box.get() for _ in range(3)] == ["r1", "s1", "s2"]
        box.put_step("s4")
        box.clear_steps()  # a snapshot supersedes queued steps
        assert box.num_steps == 0 and box.max_steps_seen == 2
        assert box.put_reply("a") and box.put_reply("b") and not box.put_reply("c")

    asyncio.run(go())


def test_command_queue_bounds_client_ops_but_not_lifecycle():
    q = C.CommandQueue(max_client_ops=2)
    assert q.try_put(C.TakeSnapshot(1)) and q.try_put(C.TakeSnapshot(1))
    assert not q.try_put(C.TakeSnapshot(1))
    q.put(C.Detach(1))  # always accepted
    assert len(q.take(block=False, limit=10)) == 3
    assert q.try_put(C.TakeSnapshot(1))
    assert q.take(block=False, limit=10) == [C.TakeSnapshot(1)]
    assert q.take(block=False, limit=10) == []


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

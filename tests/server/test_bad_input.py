"""Every kind of bad input gets its error, and the same server keeps serving."""

import json

import pytest
from websockets.exceptions import ConnectionClosed

from engine.client import KVScopeClient, ServerError
from tests.server.helpers import GREEDY, raw, recv_until, send

LONG = {"temperature": 0.0, "max_tokens": 40, "ignore_eos": True}


def _error(ws, timeout=20.0) -> dict:
    return recv_until(ws, lambda m: m["type"] == "error", timeout)[0]


def test_bad_frames_get_errors_and_the_connection_stays_open(make_server):
    server = make_server(max_frame_bytes=4096)
    ws = raw(server.url)
    cases = [
        ("not json", "bad_json"),
        (b"\x00\x01binary", "binary_frame"),
        ("[1, 2]", "bad_json"),
        ('{"type": "frobnicate"}', "unknown_op"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"temperature": -1}, "request_id": "t"}),
         "bad_params"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"top_p": 2.0}}), "bad_params"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"tempreature": 1}}), "bad_params"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"n": "2"}}), "bad_params"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"n": 10**6}}), "bad_params"),
        # past 64 bits these once crashed the engine step, aborting everyone's requests
        (json.dumps({"type": "submit", "prompt": "x", "params": {"seed": 10**30}}), "bad_params"),
        (json.dumps({"type": "submit", "prompt": "x", "params": {"top_k": 10**30}}), "bad_params"),
        (json.dumps({"type": "submit", "prompt": "word " * 100, "request_id": "long"}), "prompt_too_long"),
        (json.dumps({"type": "submit", "prompt": [1, 99999]}), "bad_request"),
        (json.dumps({"type": "submit", "prompt": ""}), "empty_prompt"),
        (json.dumps({"type": "submit", "prompt": []}), "empty_prompt"),
        (json.dumps({"type": "submit", "messages": [{"role": "system", "content": ""},
                                                    {"role": "user", "content": "  "}]}),
         "empty_prompt"),
        (json.dumps({"type": "submit"}), "bad_request"),
        (json.dumps({"type": "abort", "request_id": "nobody"}), "unknown_request"),
        (json.dumps({"type": "restart", "engine": {"model": "x"}}), "bad_config"),
        (json.dumps({"type": "restart", "engine": {"block_size": 0}}), "bad_config"),
        (json.dumps({"type": "restart", "engine": {"num_kv_blocks": 1}}), "bad_config"),
        (json.dumps({"type": "restart", "engine": {"num_kv_blocks": 10**9}}), "bad_config"),
        (json.dumps({"type": "restart", "engine": {"max_model_len": 10**7}}), "bad_config"),
        (json.dumps({"type": "submit", "prompt": "y" * 5000}), "too_large"),
    ]
    for frame, code in cases:
        ws.send(frame)
        err = _error(ws)
        assert err["code"] == code, (frame[:60], err)
        assert err["message"]
    # errors that belong to a request say which
    send(ws, type="submit", prompt="word " * 100, request_id="long2")
    assert _error(ws)["request_id"] == "long2"
    # a reused request id is refused
    send(ws, type="submit", prompt="ok", params=GREEDY, request_id="dup")
    recv_until(ws, lambda m: m["type"] == "finished")
    send(ws, type="submit", prompt="ok", params=GREEDY, request_id="dup")
    assert _error(ws)["code"] == "duplicate_request_id"
    # ... and the same connection still serves a valid request
    send(ws, type="submit", prompt="fine", params=GREEDY, request_id="good")
    fin, _ = recv_until(ws, lambda m: m["type"] == "finished" and m["request_id"] == "good")
    assert fin["outputs"][0]["finish_reason"] == "length"
    ws.close()


def test_a_too_large_submit_is_refused_with_its_request_id(make_server):
    server = make_server(max_frame_bytes=4096)
    ws = raw(server.url)
    send(ws, type="submit", prompt="y" * 5000, request_id="big-1")
    err = _error(ws)
    assert (err["code"], err["request_id"], err["op"]) == ("too_large", "big-1", "submit")
    ws.close()
    # so a client waiting for that request's answer gets the refusal, not a timeout
    with KVScopeClient(server.url, timeout=20) as c:
        with pytest.raises(ServerError) as refused:
            c.submit("z" * 6000, params=GREEDY, request_id="big-2")
        assert refused.value.code == "too_large" and refused.value.request_id == "big-2"


def test_oversize_frame_closes_only_that_connection(make_server):
    server = make_server(max_frame_bytes=1024)
    ws = raw(server.url)
    ws.send("x" * 10_000)  # past 4x the limit: websockets closes with 1009 before buffering it
    with pytest.raises(ConnectionClosed) as closed:
        recv_until(ws, lambda m: False)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with KVScopeClient(server.url, timeout=20) as c:
        assert c.generate("still up", params=GREEDY).outputs[0]["finish_reason"] == "length"


def test_full_queue_and_in_flight_limit(make_server):
    # One sequence runs at a time and three may wait; a connection may have three live.
    # (Replies go out after the engine's next step, so once a0..a2 are accepted a0 runs.)
    server = make_server(engine={"max_num_seqs": 1, "max_waiting": 3}, max_in_flight_per_conn=3)
    a = raw(server.url)
    for i in range(3):
        send(a, type="submit", prompt=f"a{i}", params=LONG, request_id=f"a{i}")
    for i in range(3):
        recv_until(a, lambda m, i=i: m["type"] == "accepted" and m["request_id"] == f"a{i}")
    send(a, type="submit", prompt="a3", params=LONG, request_id="a3")
    err = _error(a)
    assert err["code"] == "too_many_in_flight" and err["request_id"] == "a3"
    b = raw(server.url)
    codes = []
    for i in range(3):
        send(b, type="submit", prompt=f"b{i}", params=LONG, request_id=f"b{i}")
        codes.append(recv_until(b, lambda m, i=i: m.get("request_id") == f"b{i}"
                                and m["type"] in ("accepted", "error"))[0].get("code"))
    assert "queue_full" in codes, codes
    # the queue drains and the server serves again
    for i in range(3):
        recv_until(a, lambda m, i=i: m["type"] == "finished" and m["request_id"] == f"a{i}", 60)
    with KVScopeClient(server.url, timeout=60) as c:
        assert c.generate("after", params=GREEDY).outputs[0]["finish_reason"] == "length"
    a.close()
    b.close()

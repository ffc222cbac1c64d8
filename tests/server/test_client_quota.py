"""Requests in flight per client address over the OpenAI API (--max-api-in-flight).

Before this (main at b923685) every HTTP call was a sink of its own with its own
in-flight cap, so one client could hold any number of calls (the engine's waiting queue
was the only bound, shared with every other client)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.openai.errors import ApiError
from engine.server.api.client_quota import ClientQuota
from engine.llm_engine import build_engine
from tests.server.helpers import healthz

BODY = {"max_tokens": 2, "temperature": 0.0, "ignore_eos": True}


def _post(port: int, body: dict, source: str = "127.0.0.1") -> tuple[int, dict | str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read().decode()
        return r.status, json.loads(data) if r.getheader("content-type", "").startswith("application/json") else data
    finally:
        conn.close()


def _held_engine(gate: threading.Event):
    """An engine whose every forward waits for ``gate``: calls stay in flight until then."""
    def factory(cfg):
        eng = build_engine(cfg)
        execute = eng.engine_core.runner.execute

        def held(out):
            assert gate.wait(60), "the test never opened the gate"
            return execute(out)

        eng.engine_core.runner.execute = held
        return eng
    return factory


def _wait_calls(port: int, n: int) -> None:
    deadline = time.monotonic() + 20
    while healthz(port)["api_calls"] != n:
        assert time.monotonic() < deadline, healthz(port)
        time.sleep(0.02)


def test_a_client_address_gets_at_most_its_quota(make_server):
    gate = threading.Event()
    server = make_server(engine_factory=_held_engine(gate), max_api_in_flight=3)
    port = server.port
    with ThreadPoolExecutor(4) as pool:
        two = pool.submit(_post, port, {**BODY, "prompt": ["a b", "c d"]})  # 2 requests
        _wait_calls(port, 1)
        one = pool.submit(_post, port, {**BODY, "prompt": "e f", "stream": True})  # 3 in flight
        _wait_calls(port, 2)
        status, body = _post(port, {**BODY, "prompt": "g h"})  # a 4th from the same address
        assert status == 429, body
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "too_many_in_flight"
        assert "3 generation request(s) in flight" in body["error"]["message"]
        assert "--max-api-in-flight" in body["error"]["message"]
        other = pool.submit(_post, port, {**BODY, "prompt": "i j"}, "127.0.0.2")  # another address
        _wait_calls(port, 3)  # admitted past the quota: its exchange is open
        assert not other.done()
        gate.set()
        assert two.result()[0] == one.result()[0] == other.result()[0] == 200
        assert len(two.result()[1]["choices"]) == 2 and "data: [DONE]" in one.result()[1]
    _wait_calls(port, 0)
    # every call gave its share back, the stream's included: 3 fit again, 4 never do
    assert _post(port, {**BODY, "prompt": ["a", "b", "c"]})[0] == 200
    status, body = _post(port, {**BODY, "prompt": ["a", "b", "c", "d"]})
    assert status == 429 and "this call adds 4" in body["error"]["message"]


def test_the_quota_counts():
    q = ClientQuota(3)
    q.take("a", 2)
    q.take("b", 3)
    q.give_back("a", 2)
    assert (q.held("a"), q.held("b")) == (0, 3)
    q.take("a", 3)
    with pytest.raises(ApiError) as err:
        q.take("a", 1)
    assert (err.value.status, err.value.code) == (429, "too_many_in_flight")
    assert q.held("a") == 3  # a refusal counts nothing

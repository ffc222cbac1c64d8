"""Streams on the wire: SSE framing byte for byte, headers, many at once, a client that
leaves mid-stream, and what the engine and the recording say about API requests."""

import http.client
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

from engine.client import KVScopeClient
from engine.store import RunStore
from tests.openai.conftest import NO_EOS, client_for, post

SSE = re.compile(rb"(data: (\{[^\n]*\})\n\n)+data: \[DONE\]\n\n")


def test_sse_framing_and_headers(server):
    body = {"model": "llama", "prompt": "frame me", "max_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    status, headers, raw = post(server, "/v1/completions", body)
    assert status == 200 and headers["content-type"] == "text/event-stream; charset=utf-8"
    assert SSE.fullmatch(raw), raw[:200]
    events = [json.loads(e[len(b"data: "):]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert all(e["id"] == headers["x-kvscope-request-id"] for e in events)
    assert headers["x-kvscope-run-id"] == server.health.run_id
    assert [e["object"] for e in events] == ["text_completion"] * len(events)
    *chunks, usage = events
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert set(chunks[0]["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                                            "prompt_token_ids", "token_ids"}  # vLLM 0.32's keys
    # chat: the role first, then content, the last piece carrying the finish (vLLM's)
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0, "stream": True, "ignore_eos": True}
    status, headers, raw = post(server, "/v1/chat/completions", body)
    assert SSE.fullmatch(raw)
    chunks = [json.loads(e[len(b"data: "):]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["system_fingerprint"] == "kvscope"  # on the last chunk: no usage chunk follows
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in chunks[1:])
    assert all("usage" not in c for c in chunks)
    # a non-streamed answer carries the same headers
    status, headers, raw = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert headers["x-kvscope-request-id"] == json.loads(raw)["id"]


def test_sixteen_concurrent_streams_all_complete(api_server):
    server = api_server(engine={"num_kv_blocks": 128})
    c = client_for(server)

    def one(i: int) -> tuple[str, str, int]:
        text, reason, usage = "", None, None
        for chunk in c.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": f"stream {i}"}],
                temperature=0, max_tokens=8, stream=True, stream_options={"include_usage": True},
                extra_body=NO_EOS):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
            else:
                usage = chunk.usage
        return text, reason, usage.completion_tokens

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert [r[1:] for r in results] == [("length", 8)] * 16
    for i in (0, 7, 15):  # each stream got its own request's text
        whole = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": f"stream {i}"}],
                                          temperature=0, max_tokens=8, extra_body=NO_EOS)
        assert whole.choices[0].message.content == results[i][0]
    assert not server.desk.exchanges


def _state(ws: KVScopeClient) -> dict:
    return ws.snapshot().state.to_dict()


LONG = 500  # tokens: seconds of tiny-model steps, so a loaded box cannot finish it before
# the client is seen to go (with 55 it sometimes ran out by length first)


def test_disconnect_mid_stream_aborts_and_frees_blocks(api_server, db_path):
    server = api_server(engine={"max_model_len": 512, "num_kv_blocks": 160})
    with KVScopeClient(server.url, timeout=30) as ws:
        assert not _state(ws)["requests"]
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "llama", "prompt": "leave me", "max_tokens": LONG, "temperature": 0,
             "stream": True, "ignore_eos": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rid = resp.getheader("x-kvscope-request-id")
        assert resp.read1(65536).startswith(b"data: ")  # the stream runs
        live = _state(ws)["requests"]
        assert rid in live and live[rid]["block_table"]  # it holds blocks
        conn.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 20
        while _state(ws)["requests"]:
            assert time.monotonic() < deadline, "the request outlived its client"
            time.sleep(0.05)
        state = _state(ws)
        assert all(b["ref_count"] == 0 for b in state["blocks"])
        assert len(state["free_queue"]) == state["num_blocks"]
        run_id = ws.run_id
    server.stop()
    events = [e for s in RunStore(db_path).load_steps(run_id) for e in s.events]
    assert any(e.type == "request_finished" and e.request_id == rid and e.reason == "abort"
               for e in events)
    (row,) = [r for r in RunStore(db_path).load_requests(run_id) if r["request_id"] == rid]
    assert row["source"] == "openai" and row["outputs"][0]["finish_reason"] == "abort"
    assert len(row["outputs"][0]["token_ids"]) < LONG


def test_api_requests_go_through_the_same_engine_events_and_recording(api_server, db_path):
    server = api_server()
    c = client_for(server)
    with KVScopeClient(server.url, timeout=30) as ws:
        raw = c.completions.with_raw_response.create(model="llama", prompt="watch me", max_tokens=3,
                                                     extra_body=NO_EOS)
        rid = raw.headers["x-kvscope-request-id"]
        assert raw.parse().id == rid and raw.headers["x-kvscope-run-id"] == ws.run_id
        chat = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2, extra_body=NO_EOS)
        two = c.completions.with_raw_response.create(model="llama", prompt=["a", "b"], max_tokens=2,
                                                     extra_body=NO_EOS)
        mine = ws.generate("from the websocket", params={"max_tokens": 2, "ignore_eos": True})
        while ws.poll(0.3):  # replies overtake steps: read the idle engine's last steps
            pass
        steps = ws.drain_steps()
        arrived = {e.request_id for s in steps for e in s.events if e.type == "request_arrived"}
        base = two.headers["x-kvscope-request-id"]
        assert {rid, chat.id, f"{base}-0", f"{base}-1", mine.request_id} <= arrived
        run_id = ws.run_id
    server.stop()
    rows = {r["request_id"]: r for r in RunStore(db_path).load_requests(run_id)}
    assert {k: rows[k]["source"] for k in (rid, chat.id, f"{base}-0", mine.request_id)} == {
        rid: "openai", chat.id: "openai", f"{base}-0": "openai", mine.request_id: "websocket"}
    assert rows[rid]["prompt"] == "watch me" and rows[rid]["params"]["max_tokens"] == 3
    assert rows[chat.id]["prompt"].startswith("<|im_start|>user\nhi")  # the chat template applied


def test_shutdown_ends_streams_with_abort(api_server):
    server = api_server(engine={"max_model_len": 512, "num_kv_blocks": 160})
    c = client_for(server)
    stream = c.completions.create(model="llama", prompt="long one", max_tokens=LONG, temperature=0,
                                  stream=True, extra_body=NO_EOS)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(server.stop)
        rest = list(stream)  # ends: the server aborted it and closed the stream with [DONE]
        stopping.result(30)
    assert rest[-1].choices[0].finish_reason == "abort"
    assert time.monotonic() - t0 < 10

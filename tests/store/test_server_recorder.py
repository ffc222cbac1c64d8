"""The recorder inside a real server: a bad request id never reaches it, and a failing
database shows in /healthz (degraded) and /metrics while serving goes on."""

import json

from engine.client.client import KVScopeClient
from engine.config import EngineConfig
from engine.core.ids import RequestIdError
from engine.llm_engine import build_engine
from engine.store import RunStore
from tests.server.conftest import ENGINE, db_path, make_server, tiny_llama  # noqa: F401 (fixtures)
from tests.server.helpers import GREEDY, healthz, http_get, raw, recv_until, send
from tests.store.helpers import wait_until


def recorder_metrics(port):
    text = http_get(port, "/metrics")[1]
    return {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("kvscope_recorder_")}


def test_lone_surrogate_id_is_refused_and_the_run_records_to_the_end(make_server, db_path):
    server = make_server()
    ws = raw(server.url)
    # json.loads turns this escape into a lone surrogate, which UTF-8 (so SQLite) cannot hold
    ws.send('{"type": "submit", "prompt": "hi", "request_id": "x\\ud800", '
            '"params": {"temperature": 0, "max_tokens": 2}}')
    err, _ = recv_until(ws, lambda m: m["type"] == "error")
    assert err["code"] == "bad_request" and err["op"] == "submit"
    assert "request_id may only use the characters" in err["message"] and "\\ud800" in err["message"]
    send(ws, type="submit", prompt="after the bad one", params=GREEDY, request_id="after-bad")
    fin, _ = recv_until(ws, lambda m: m["type"] == "finished" and m["request_id"] == "after-bad")
    assert fin["outputs"][0]["finish_reason"] == "length"
    h = healthz(server.port)
    assert h["status"] == "ready" and h["recorder"]["alive"] and h["recorder"]["skipped_rows_total"] == 0
    run_id = h["run_id"]
    ws.close()
    server.stop()
    store = RunStore(db_path)
    [run] = store.list_runs()
    assert run["id"] == run_id and run["finished_at"] is not None and run["num_steps"] >= 6
    assert [r["request_id"] for r in store.load_requests(run_id)] == ["after-bad"]


def test_the_engine_refuses_a_bad_id_from_the_python_api(tiny_llama):
    eng = build_engine(EngineConfig(model=tiny_llama, **ENGINE))
    for rid in ("x\ud800", "", "a#1", "a" * 129):
        try:
            eng.add_request("hi", request_id=rid)
        except RequestIdError as exc:
            assert "request_id" in str(exc)
        else:
            raise AssertionError(f"{rid!r} was accepted")
    assert not eng.has_unfinished_requests() and not eng.output_processor.requests
    assert eng.add_request("hi", request_id="cmpl-1") == "cmpl-1"
    assert eng.add_request("hi") == "req-0"


def test_a_failing_database_degrades_healthz_and_shows_in_metrics(make_server, tmp_path):
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(bytes(range(256)) * 64)
    server = make_server(ready=False, db=str(corrupt))
    assert server.wait_ready(60).serving
    assert wait_until(lambda: healthz(server.port)["status"] == "degraded")
    h = healthz(server.port)
    assert h["detail"].startswith("recorder failing: database file is corrupt")
    assert h["run_id"] and h["recorder"]["fault"] and h["recorder"]["errors_total"] >= 1
    assert http_get(server.port, "/healthz")[0] == 200  # degraded still serves: probes pass
    with KVScopeClient(server.url, timeout=20) as c:  # websockets are still let in
        assert c.generate("still serving", params=GREEDY).outputs[0]["finish_reason"] == "length"
    m = recorder_metrics(server.port)
    assert m["kvscope_recorder_errors_total"] >= 1 and m["kvscope_recorder_up"] == 0
    assert m["kvscope_recorder_backlog_steps"] >= 6  # the generation's steps wait for a retry
    assert m["kvscope_recorder_written_rows_total"] == 0
    assert json.loads(http_get(server.port, "/healthz")[1])["recorder"]["backlog_steps"] >= 6

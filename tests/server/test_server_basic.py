"""One server, one client: the protocol's happy paths, restart, loading and idling."""

import resource
import time

import pytest

from engine.client import KVScopeClient, ServerError
from engine.events.schema.types import PROTOCOL_VERSION
from engine.store import RunStore
from tests.server.conftest import Gate
from tests.server.helpers import GREEDY, healthz, raw, recv_until, send


def test_hello_snapshot_submit_stream_finished(make_server):
    server = make_server()
    with KVScopeClient(server.url, timeout=20) as c:
        assert c.hello.protocol == PROTOCOL_VERSION == 2 and c.run_id == server.health.run_id
        assert c.config["num_blocks"] == 64 and c.config["block_size"] == 4
        assert c.hello.limits["max_in_flight_per_connection"] == 64
        snap = c.initial_snapshot
        assert snap.seq == -1 and snap.state.num_blocks == 64
        rid = c.submit("hello world", params=GREEDY, request_id="mine-1")
        assert rid == "mine-1"
        msgs = list(c.stream(rid))
        outs, fin = msgs[:-1], msgs[-1]
        assert fin.type == "finished" and all(m.type == "output" for m in outs)
        (sample,) = fin.outputs
        assert sample["finish_reason"] == "length" and len(sample["token_ids"]) == 6
        assert sum((m.token_ids for m in outs), []) == sample["token_ids"]
        assert "".join(m.text_delta for m in outs) == sample["text"]
        m = fin.metrics
        assert m["num_prompt_tokens"] > 0 and m["num_cached_tokens"] == 0
        assert 0 <= m["ttft"] <= m["e2e"] and m["arrival_time"] <= m["first_token_time"]
        # the same prompt again hits the prefix cache
        again = c.generate("hello world", params=GREEDY)
        assert again.outputs[0]["token_ids"] == sample["token_ids"]
        assert again.metrics["num_cached_tokens"] >= 4
        steps = c.drain_steps()
        assert [s.seq for s in steps] == list(range(len(steps))) and steps
        assert {"seq", "step", "ts", "events", "metrics"} <= set(steps[0].to_dict())
        assert c.ping() < 5
        assert c.reset_prefix_cache().result["num_blocks_reset"] >= 1
        assert c.snapshot().seq >= steps[-1].seq
        # n=2 chat request: two samples, streamed by index
        fin2 = c.generate(messages=[{"role": "user", "content": "hi"}],
                          params={"n": 2, "temperature": 1.0, "seed": 3, "max_tokens": 4})
        assert [o["index"] for o in fin2.outputs] == [0, 1]


@pytest.mark.parametrize("core_here", [True, False], ids=["inproc-core", "core-process"])
def test_abort_restart_and_recording(make_server, db_path, core_here):
    # with the core in a process of its own too (kvscope serve's): the aborts, the old
    # run's end and the new run's start reach the recorder in order
    server = make_server(core_here=core_here)
    with KVScopeClient(server.url, timeout=20) as a, KVScopeClient(server.url, timeout=20) as b:
        first_run = a.run_id
        long = a.submit("a long one", params={"temperature": 0, "max_tokens": 50})
        a.abort(long)
        fin = list(a.stream(long))[-1]
        assert fin.outputs[0]["finish_reason"] == "abort"
        with pytest.raises(ServerError) as err:
            b.restart({"num_kv_blocks": 0})
        assert err.value.code == "bad_config"
        with pytest.raises(ServerError) as err:
            b.restart({"model": "elsewhere"})
        assert err.value.code == "bad_config"
        inflight = a.submit("still running", params={"temperature": 0, "max_tokens": 50})
        hello = b.restart({"num_kv_blocks": 32, "enable_prefix_caching": False})
        assert hello.run_id != first_run and hello.config["num_blocks"] == 32
        assert b.latest_snapshot.seq == -1 and b.latest_snapshot.state.num_blocks == 32
        fin = list(a.stream(inflight))[-1]
        assert fin.outputs[0]["finish_reason"] == "abort"
        assert a.snapshot().state.num_blocks == 32 and a.hello.run_id == hello.run_id
        assert a.generate("new engine", params=GREEDY).outputs[0]["finish_reason"] == "length"
    server.stop()
    runs = {r["id"]: r for r in RunStore(db_path).list_runs()}
    assert set(runs) == {first_run, hello.run_id}
    assert all(r["finished_at"] is not None for r in runs.values())
    assert runs[first_run]["num_requests"] == 2 and runs[hello.run_id]["num_requests"] == 1
    reqs = RunStore(db_path).load_requests(first_run)
    assert [r["outputs"][0]["finish_reason"] for r in reqs] == ["abort", "abort"]


def test_abort_all_ends_every_connections_requests(make_server):
    server = make_server()
    with KVScopeClient(server.url, timeout=20) as a, KVScopeClient(server.url, timeout=20) as b:
        mine = [a.submit(f"a long one {i}", params={"temperature": 0, "max_tokens": 200})
                for i in range(2)]
        theirs = b.submit("b's request", params={"temperature": 0, "max_tokens": 200})
        ok = b.abort_all()  # b stops a's requests too
        assert ok.op == "abort_all" and ok.result == {"num_aborted": 3}
        for c, rid in [(a, mine[0]), (a, mine[1]), (b, theirs)]:
            assert list(c.stream(rid))[-1].outputs[0]["finish_reason"] == "abort"
        assert a.abort_all().result == {"num_aborted": 0}  # nothing left: still ok
        assert a.snapshot().state.summary().num_requests_running == 0
        # the long-prefill cap is one of the options a restart may change
        hello = b.restart({"long_prefill_token_threshold": 8})
        assert hello.config["long_prefill_token_threshold"] == 8
        with pytest.raises(ServerError) as err:
            b.restart({"long_prefill_token_threshold": -1})
        assert err.value.code == "bad_config"


def test_healthz_loading_then_ready_and_websockets_refused_while_loading(make_server):
    gate = Gate()
    server = make_server(ready=False, engine_factory=gate)
    h = healthz(server.port)
    assert h["status"] == "loading" and h["detail"]
    with pytest.raises(ServerError) as err:
        KVScopeClient(server.url, timeout=5).connect()
    assert err.value.code == "loading"
    gate.open()
    c = KVScopeClient(server.url, timeout=20)
    c.connect(wait=30)  # retries through the 503s
    h = healthz(server.port)
    assert h["status"] == "ready" and h["run_id"] == c.run_id and h["model"] == "llama"
    c.close()


def test_load_failure_is_reported(make_server, tmp_path):
    server = make_server(engine={"model": str(tmp_path / "no-such-model")}, ready=False)
    assert server.wait_ready(30).status.value == "error"
    h = healthz(server.port)
    assert h["status"] == "error" and h["detail"]


def test_idle_engine_sends_no_steps_and_does_not_spin(make_server):
    server = make_server()
    ws = raw(server.url)
    send(ws, type="submit", prompt="x", params=GREEDY, request_id="r")
    _, before = recv_until(ws, lambda m: m["type"] == "finished")
    step = next((m for m in before if m["type"] == "step"), None)  # the step frame, on the wire
    if step is None:  # replies go first: the steps may still be queued behind them
        step, _ = recv_until(ws, lambda m: m["type"] == "step")
    assert set(step) == {"type", "seq", "step", "ts", "events", "metrics"}
    time.sleep(0.2)
    while True:  # drain what was already sent
        try:
            ws.recv(timeout=0.1)
        except TimeoutError:
            break
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    with pytest.raises(TimeoutError):
        ws.recv(timeout=1.0)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    assert (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime) < 0.3
    ws.close()

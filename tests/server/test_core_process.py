"""A server whose engine core runs in a process of its own (kvscope serve's default, and
every server of these suites unless a test asks for ``core_here``): the same answers as
a core in the server's process, a dead core seen and said, a load that can be given up,
and a serving process that never imports torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import openai
import pytest

from engine.client.client import KVScopeClient
from engine.engine_core.client import PROCESS_NAME
from engine.events.folds.reducer import PoolState
from engine.store.runs import RunStore
from tests.server.helpers import GREEDY, healthz

N2 = {"n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 5, "ignore_eos": True}


def _core_children() -> list[int]:
    """This process's children that run an engine core (any thread may have started one)."""
    out = []
    for task in os.listdir("/proc/self/task"):
        try:
            children = open(f"/proc/self/task/{task}/children").read().split()
        except OSError:  # the thread ended meanwhile (its children passed to another thread)
            continue
        for pid in children:
            try:
                cmd = open(f"/proc/{pid}/cmdline").read()
            except OSError:  # gone meanwhile
                continue
            if PROCESS_NAME in cmd and os.path.exists(f"/proc/{pid}") and _running(pid):
                out.append(int(pid))
    return out


def _running(pid: str) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is not running


def test_a_core_process_server_answers_as_an_inproc_one_and_records_it(make_server, db_path):
    here = make_server(db=db_path + ".here", core_here=True)
    with KVScopeClient(here.url, timeout=30) as c:
        want = c.generate("hello world", params=GREEDY).outputs
        want_n2 = c.generate("fork me", params=N2).outputs
    here.stop()
    server = make_server()
    pid = server.worker.engine.core.pid
    assert healthz(server.port)["engine"] == {"process": True, "pid": pid} and pid != os.getpid()
    with KVScopeClient(server.url, timeout=30) as c:
        state = PoolState.from_snapshot(c.initial_snapshot.state)
        rid = c.submit("hello world", params=GREEDY, request_id="mine")
        msgs = list(c.stream(rid))
        assert msgs[-1].outputs == want  # token-exact with the core in the server's process
        assert sum((m.token_ids for m in msgs[:-1]), []) == want[0]["token_ids"]
        assert c.generate("fork me", params=N2).outputs == want_n2
        c.poll(0.3)
        fresh = c.snapshot()
        steps = c.drain_steps()
        assert [s.seq for s in steps] == list(range(fresh.seq + 1))
        for s in steps:
            state.apply_step(s)
        assert state.to_snapshot() == fresh.state  # the steps rebuild the core's true pool
        api = openai.OpenAI(base_url=server.http_url, api_key="none")
        done = api.completions.create(model=server.options.model_name, prompt="hello world", max_tokens=6,
                                      temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True},
                                      logprobs=1)
        assert done.choices[0].token_ids == want[0]["token_ids"]
        assert len(done.choices[0].logprobs.tokens) == 6
    run_id = server.health.run_id
    server.stop()
    assert not _core_children()  # the core's process ended with its server
    store = RunStore(db_path)
    (run,) = store.list_runs()
    assert run["id"] == run_id and run["finished_at"] is not None and run["num_requests"] == 3
    assert sorted(r["source"] for r in store.load_requests(run_id)) == ["openai", "websocket", "websocket"]
    assert len(store.load_steps(run_id)) >= len(steps)


def test_a_dead_core_shows_in_health_and_the_api(make_server, db_path):
    server = make_server()
    run_id = server.health.run_id
    os.kill(server.worker.engine.core.pid, signal.SIGKILL)
    deadline = time.monotonic() + 20  # an idle worker looks at its core every 0.5 s
    while healthz(server.port)["status"] != "error":
        assert time.monotonic() < deadline, healthz(server.port)
        time.sleep(0.05)
    assert "the engine core process died (exit code -9)" in healthz(server.port)["detail"]
    api = openai.OpenAI(base_url=server.http_url, api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        api.completions.create(model=server.options.model_name, prompt="hi", max_tokens=2)
    assert err.value.status_code == 503
    server.stop()
    (run,) = RunStore(db_path).list_runs()
    assert run["id"] == run_id and run["finished_at"] is not None


def test_stopping_while_the_core_loads_ends_its_process(make_server):
    server = make_server(ready=False)
    deadline = time.monotonic() + 20
    while not _core_children():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert healthz(server.port)["status"] == "loading"  # the child is still importing torch
    t0 = time.monotonic()
    server.stop()
    assert not _core_children() and time.monotonic() - t0 < 20


def test_a_request_that_cannot_cross_fails_alone(make_server):
    from engine.protocol.ops import Submit
    from engine.server.worker.mailbox import Prepared
    from tests.server.door import ListSink

    server = make_server()
    sink = ListSink(server.mailbox.new_sink_id())
    odd = Prepared(Submit(prompt="x", request_id="odd"), "x", [1, object()])  # no msgpack for it
    assert server.mailbox.send(sink, odd)
    deadline = time.monotonic() + 20
    while not sink.items:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (err,) = sink.items
    assert (err.code, err.request_id, err.op) == ("bad_request", "odd", "submit")
    with KVScopeClient(server.url, timeout=30) as c:
        assert c.generate("still serving", params=GREEDY).outputs[0]["finish_reason"] == "length"


def test_the_serving_process_never_imports_torch(tiny_llama, tmp_path):
    """A whole server (the loop, the API, the recorder, tokenizing and detokenizing) with
    its core in a child: torch is only ever imported there."""
    script = textwrap.dedent(f"""
        import sys, json, urllib.request
        from engine.config import EngineConfig
        from engine.server.app import KVScopeServer, ServerOptions

        def main():
            cfg = EngineConfig(model={tiny_llama!r}, engine_core_process=True, num_threads=1,
                               block_size=4, num_kv_blocks=64, max_model_len=64)
            server = KVScopeServer(ServerOptions(cfg, port=0, db={str(tmp_path / "r.sqlite")!r})).start()
            try:
                assert server.wait_ready(60).status.value == "ready"
                body = json.dumps({{"model": cfg.model, "max_tokens": 4, "temperature": 0,
                                    "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
                req = urllib.request.Request(server.http_url + "/chat/completions", body,
                                             {{"Content-Type": "application/json"}})
                answer = json.load(urllib.request.urlopen(req, timeout=60))
                print(answer["usage"]["completion_tokens"], "torch" in sys.modules)
            finally:
                server.stop()

        if __name__ == "__main__":
            main()
    """)
    path = tmp_path / "serve_no_torch.py"
    path.write_text(script)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["4", "False"], done.stdout

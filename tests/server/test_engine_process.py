"""The engine in a process of its own (engine.server.engine_process, kvscope serve's default).

The whole server suite also runs this way with KVSCOPE_TEST_ENGINE_PROCESS=1; these are
the checks the suite runs every time: the output wire rebuilds every RequestOutput
exactly, and a process-mode server answers, streams, records, stops and reports a dead
engine as the thread does (a restart: tests/server/test_server_basic.py, both ways).
"""

from __future__ import annotations

import os
import pickle
import signal
import time

import openai
import pytest

from engine.client import KVScopeClient
from engine.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.events.folds.reducer import PoolState
from engine.outputs import RequestOutput
from engine.server.engine_process import EngineProcess
from engine.server.output_wire import OutputDelta, OutputMirror, OutputWire
from engine.startup import build_engine
from engine.store import RunStore
from tests.server.conftest import ENGINE
from tests.server.helpers import GREEDY, healthz


def _frozen(out: RequestOutput) -> dict:
    """Everything a reader can see of ``out`` now (live views copied)."""
    return out.to_dict()


# ---- the wire, against a real engine's outputs -------------------------------------------------


def test_wire_rebuilds_every_output_and_sends_the_prompt_once(tiny_llama):
    engine = build_engine(EngineConfig(model=tiny_llama, **ENGINE, num_threads=1))
    engine.add_request(prompt=list(range(3, 40)), request_id="long-prompt",
                       params=SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, logprobs=2))
    engine.add_request(prompt="two samples", request_id="forked",
                       params=SamplingParams(n=2, max_tokens=7, temperature=1.0, seed=5, ignore_eos=True,
                                             logprobs=1))
    engine.add_request(prompt="stops early", request_id="stopped",
                       params=SamplingParams(max_tokens=12, temperature=1.0, seed=1, stop=["xyzzy"],
                                             ignore_eos=True))  # held-back text: the stop string might start
    wire, mirror = OutputWire(), OutputMirror()
    seen: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            want = _frozen(out)  # before the engine moves on
            item = pickle.loads(pickle.dumps(wire.slim(out)))
            first = seen.get(out.request_id) is None
            seen[out.request_id] = seen.get(out.request_id, 0) + 1
            if out.finished:
                assert isinstance(item, RequestOutput)
            else:
                assert isinstance(item, OutputDelta)
                assert (item.head is not None) == first  # the prompt crosses once
                assert sum(len(s[2]) for s in item.samples) == sum(len(ids) for _, ids in out.deltas.values())
            got = mirror.full(item)
            assert _frozen(got) == want
    assert set(seen) == {"long-prompt", "forked", "stopped"} and min(seen.values()) >= 2
    assert len(mirror) == 0 and wire.sent == {}  # finished outputs end both sides


def test_wire_forgets_requests_released_without_a_finished_output(tiny_llama):
    engine = build_engine(EngineConfig(model=tiny_llama, **ENGINE, num_threads=1))
    engine.add_request(prompt="hello", request_id="r", params=SamplingParams(max_tokens=8, temperature=0.0))
    wire, mirror = OutputWire(), OutputMirror()
    (out,) = engine.step()
    mirror.full(wire.slim(out))
    assert "r" in wire.sent and len(mirror) == 1
    gone = wire.forget_all_but(lambda rid: False)
    mirror.forget(gone)
    assert gone == ["r"] and wire.sent == {} and len(mirror) == 0


# ---- a server with the engine in a child process -----------------------------------------------


def _engine(server) -> EngineProcess:
    w = server.worker
    assert isinstance(w, EngineProcess) and w.pid != os.getpid()
    return w


def test_process_server_streams_records_and_matches_the_thread(make_server, db_path):
    thread = make_server(db=db_path + ".thread")
    with KVScopeClient(thread.url, timeout=30) as c:
        want = c.generate("hello world", params=GREEDY).outputs
        want_n2 = c.generate("fork me", params={"n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 5,
                                                "ignore_eos": True}).outputs
    server = make_server(engine_process=True, engine={"num_threads": 1})
    child = _engine(server)
    assert healthz(server.port)["engine"] == {"process": True, "pid": child.pid}
    with KVScopeClient(server.url, timeout=30) as c:
        state = PoolState.from_snapshot(c.initial_snapshot.state)
        rid = c.submit("hello world", params=GREEDY, request_id="mine")
        msgs = list(c.stream(rid))
        fin = msgs[-1]
        assert fin.outputs == want  # token-exact with the thread's engine
        assert sum((m.token_ids for m in msgs[:-1]), []) == want[0]["token_ids"]
        assert c.generate("fork me", params={"n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 5,
                                             "ignore_eos": True}).outputs == want_n2
        c.poll(0.3)
        fresh = c.snapshot()
        steps = c.drain_steps()
        assert [s.seq for s in steps] == list(range(fresh.seq + 1))
        for s in steps:
            state.apply_step(s)
        assert state.to_snapshot() == fresh.state  # the steps rebuild the child's true pool
        api = openai.OpenAI(base_url=server.http_url, api_key="none")
        done = api.completions.create(model=server.options.model_name, prompt="hello world", max_tokens=6,
                                      temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True},
                                      logprobs=1)
        assert done.choices[0].token_ids == want[0]["token_ids"]
        assert len(done.choices[0].logprobs.tokens) == 6
    run_id = server.health.run_id
    server.stop()
    assert not child.is_alive()
    store = RunStore(db_path)
    (run,) = store.list_runs()
    assert run["id"] == run_id and run["finished_at"] is not None and run["num_requests"] == 3
    sources = sorted(r["source"] for r in store.load_requests(run_id))
    assert sources == ["openai", "websocket", "websocket"]
    assert len(store.load_steps(run_id)) >= len(steps)


def test_a_dead_engine_process_shows_in_health_and_the_api(make_server, db_path):
    server = make_server(engine_process=True, engine={"num_threads": 1})
    child = _engine(server)
    run_id = server.health.run_id
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while healthz(server.port)["status"] != "error":
        assert time.monotonic() < deadline, healthz(server.port)
        time.sleep(0.05)
    assert "engine process exited unexpectedly (exit code -9)" in healthz(server.port)["detail"]
    api = openai.OpenAI(base_url=server.http_url, api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        api.completions.create(model=server.options.model_name, prompt="hi", max_tokens=2)
    assert err.value.status_code == 503
    server.stop()
    (run,) = RunStore(db_path).list_runs()
    assert run["id"] == run_id and run["finished_at"] is not None


def test_stopping_while_the_engine_process_loads_ends_it(make_server):
    server = make_server(ready=False, engine_process=True, engine={"num_threads": 1})
    child = _engine(server)
    assert healthz(server.port)["status"] == "loading"  # the child is still importing
    t0 = time.monotonic()
    server.stop()
    assert not child.is_alive() and time.monotonic() - t0 < 20


def test_engine_factory_needs_the_thread(tiny_llama):
    from engine.server.app import ServerOptions

    with pytest.raises(ValueError, match="engine_process"):
        ServerOptions(EngineConfig(model=tiny_llama), engine_process=True, engine_factory=build_engine)


def test_serve_runs_the_engine_in_a_process_unless_told():
    from engine.cli import build_parser

    assert build_parser().parse_args(["serve"]).engine_process is True
    assert build_parser().parse_args(["serve", "--engine-thread"]).engine_process is False


class _Conn:
    """A pipe end that refuses to pickle one item."""

    def __init__(self, bad) -> None:
        self.bad, self.sent = bad, []

    def send(self, msg) -> None:
        if msg[0] == "batch" and any(item is self.bad for item in msg[1]):
            raise pickle.PicklingError("no")
        self.sent.append(msg)


def test_an_item_that_will_not_pickle_costs_only_itself():
    from engine.server.engine_process import Channel

    bad = object()
    conn = _Conn(bad)
    channel = Channel(conn)
    channel.send(("batch", ["a", bad, "b"]))
    channel.send(("batch", ["c"]))
    assert conn.sent == [("batch", ["a"]), ("batch", ["b"]), ("batch", ["c"])] and not channel.broken


def test_a_command_that_will_not_pickle_is_refused_and_the_engine_serves_on(make_server):
    from engine.protocol.ops import Submit
    from engine.server.mailbox import Prepared
    from tests.server.door import ListSink

    server = make_server(engine_process=True, engine={"num_threads": 1})
    sink = ListSink(server.mailbox.new_sink_id())
    unpicklable = Prepared(Submit(prompt="x", request_id="odd"), "x", (t for t in [1, 2]))
    assert server.mailbox.send(sink, unpicklable)
    deadline = time.monotonic() + 20
    while not sink.items:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (err,) = sink.items
    assert (err.code, err.request_id, err.op) == ("internal", "odd", "submit")
    with KVScopeClient(server.url, timeout=30) as c:
        assert c.generate("still serving", params=GREEDY).outputs[0]["finish_reason"] == "length"

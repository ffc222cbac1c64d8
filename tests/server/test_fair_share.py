"""The scheduling policy through the server: each websocket connection is a client.

One connection fills every seat (``max_num_seqs=4``) with long requests and queues
more; a second connection then asks for a short one. Under "fcfs" (vLLM's order) it
waits for a seat until the first connection's early requests are done; under "fair"
(``kvscope serve``'s default) the first connection's newest runner gives up its seat
at once and the short request finishes before any of the long ones."""

import pytest

from engine.client import KVScopeClient
from engine.cli import build_parser
from engine.store import RunStore

LONG = {"temperature": 0.0, "max_tokens": 200, "ignore_eos": True}  # ~200 steps: B comes well before
SHORT = {"temperature": 0.0, "max_tokens": 3, "ignore_eos": True}


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_a_second_client_is_not_starved_by_one_holding_every_seat(make_server, db_path, policy):
    server = make_server(engine={"max_num_seqs": 4, "num_kv_blocks": 256, "max_model_len": 256,
                                 "scheduling_policy": policy}, core_here=True)  # reads the core
    with KVScopeClient(server.url, timeout=60) as a, KVScopeClient(server.url, timeout=60) as b:
        hog = [a.submit(f"hog prompt {i}", request_id=f"hog-{i}", params=LONG) for i in range(8)]
        first = next(iter(a.stream(hog[0])))  # hog-0 has a token: the first four hold the seats
        assert first.type == "output"
        clients = {r.client for r in server.worker.engine.engine_core.scheduler.requests.values()}
        assert len(clients) == 1 and clients.pop().startswith("websocket:")
        fin = list(b.stream(b.submit("short question", request_id="short", params=SHORT)))[-1]
        assert fin.type == "finished" and len(fin.outputs[0]["token_ids"]) == 3
        for rid in hog:
            assert list(a.stream(rid))[-1].outputs[0]["finish_reason"] == "length"
    run_id = server.health.run_id
    server.stop()
    done_at = {e.request_id: s.seq for s in RunStore(db_path).load_steps(run_id)
               for e in s.events if e.type == "request_finished"}
    preempted = [e.request_id for s in RunStore(db_path).load_steps(run_id)
                 for e in s.events if e.type == "request_preempted"]
    long_done = sorted(done_at[r] for r in hog)
    if policy == "fcfs":  # a seat opens only when hog-0..3 finish together
        assert done_at["short"] > long_done[3]
        assert preempted == []
    else:
        assert done_at["short"] < long_done[0]
        assert preempted[0] == "hog-3"  # the newest runner of the client holding every seat


@pytest.mark.parametrize("ratio", [0, 2])
def test_a_heavy_client_takes_at_most_ratio_times_a_light_clients_part_of_each_step(
        make_server, db_path, ratio):
    """Connection A runs 8 long requests; B's one short request then shares every step
    with at most `ratio` of A's (without the bound, with an equal half of 8 seats: 4)."""
    server = make_server(engine={"max_num_seqs": 8, "num_kv_blocks": 256, "max_model_len": 256,
                                 "scheduling_policy": "fair", "fair_ratio": ratio})
    with KVScopeClient(server.url, timeout=60) as a, KVScopeClient(server.url, timeout=60) as b:
        hog = [a.submit(f"hog prompt {i}", request_id=f"hog-{i}", params=LONG) for i in range(8)]
        for rid in hog:  # every one of A's has a token: all 8 hold seats and decode
            assert next(iter(a.stream(rid))).type == "output"
        fin = list(b.stream(b.submit("short question", request_id="short", params=SHORT)))[-1]
        assert fin.type == "finished" and len(fin.outputs[0]["token_ids"]) == 3
        a.abort_all()
    run_id = server.health.run_id
    server.stop()
    beside = [sum(1 for e in s.events if e.type == "request_scheduled" and e.request_id.startswith("hog"))
              for s in RunStore(db_path).load_steps(run_id)
              if any(e.type == "request_scheduled" and e.request_id == "short" for e in s.events)]
    assert len(beside) == 3  # one prefill step with the sample, then two decodes
    assert beside == [ratio or 4] * 3


def test_serve_defaults_to_fair_and_the_library_to_fcfs():
    from engine.config import EngineConfig
    from engine.server.commands import SERVE_DEFAULTS, serve_differences

    library = EngineConfig()
    assert library.scheduling_policy == "fcfs" and library.fair_ratio == 0 and not library.engine_core_process
    args = build_parser().parse_args(["serve"])
    assert args.scheduling_policy == "fair"
    assert args.fair_ratio == SERVE_DEFAULTS["fair_ratio"][0] == 2
    assert args.engine_core_process is True
    # each difference from the library's defaults is in the one list, and printed at start
    assert set(SERVE_DEFAULTS) == {f for f in ("scheduling_policy", "fair_ratio", "engine_core_process")
                                   if getattr(args, f) != getattr(library, f)}
    served = EngineConfig(scheduling_policy="fair", fair_ratio=2, engine_core_process=True)
    assert [line.split("=")[0] for line in serve_differences(served)] == list(SERVE_DEFAULTS)
    assert serve_differences(library) == []
    assert build_parser().parse_args(["serve", "--engine-core-in-process"]).engine_core_process is False
    assert build_parser().parse_args(["serve", "--fair-ratio", "0"]).fair_ratio == 0
    assert build_parser().parse_args(["generate", "x"]).fair_ratio == 0
    args = build_parser().parse_args(["serve", "--scheduling-policy", "fcfs"])
    assert args.scheduling_policy == "fcfs"
    assert build_parser().parse_args(["generate", "x"]).scheduling_policy == "fcfs"

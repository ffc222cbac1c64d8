"""Two clients, 20 requests each, all at once: each gets exactly its own outputs,
nothing is lost, and every request is in SQLite."""

import threading

from engine.client import KVScopeClient
from engine.store import RunStore


def _client_run(url: str, name: str, results: dict, errors: list) -> None:
    try:
        with KVScopeClient(url, timeout=60) as c:
            rids = [c.submit(f"{name} prompt {i}", request_id=f"{name}-{i}",
                             params={"temperature": 0.0, "max_tokens": 3 + i % 4,
                                     "ignore_eos": True})
                    for i in range(20)]
            got = {}
            for rid in rids:
                msgs = list(c.stream(rid))
                assert all(m.request_id == rid for m in msgs)
                got[rid] = msgs
            # anything else this connection received must be steps or its own messages
            leftovers = [m for q in c._by_request.values() for m in q]
            assert not leftovers, leftovers
            results[name] = got
    except BaseException as exc:  # surface in the main thread
        errors.append(exc)


def test_two_clients_twenty_requests_each(make_server, db_path):
    server = make_server(engine={"num_kv_blocks": 128, "max_num_seqs": 16})
    results, errors = {}, []
    threads = [threading.Thread(target=_client_run, args=(server.url, n, results, errors))
               for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name in ("alice", "bob"):
        got = results[name]
        assert sorted(got) == sorted(f"{name}-{i}" for i in range(20))
        for rid, msgs in got.items():
            fin = msgs[-1]
            assert fin.type == "finished"
            i = int(rid.split("-")[1])
            (out,) = fin.outputs
            assert out["finish_reason"] == "length" and len(out["token_ids"]) == 3 + i % 4
            assert sum((m.token_ids for m in msgs[:-1]), []) == out["token_ids"]
    run_id = server.health.run_id
    server.stop()
    store = RunStore(db_path)
    reqs = {r["request_id"]: r for r in store.load_requests(run_id)}
    assert len(reqs) == 40
    for name in ("alice", "bob"):
        for rid, msgs in results[name].items():
            row = reqs[rid]
            assert row["prompt"].startswith(name)
            assert row["outputs"] == msgs[-1].outputs
            assert row["params"]["max_tokens"] == len(row["outputs"][0]["token_ids"])
            assert row["timings"]["e2e"] > 0 and row["timings"]["num_prompt_tokens"] > 0
    run = store.get_run(run_id)
    assert run["finished_at"] is not None
    steps = store.load_steps(run_id)
    assert [s.seq for s in steps] == list(range(len(steps)))
    finished = [e for s in steps for e in s.events if e.type == "request_finished"]
    assert len(finished) == 40

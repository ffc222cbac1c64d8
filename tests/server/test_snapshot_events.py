"""A late joiner's snapshot plus the step events after it equals a fresh snapshot."""

import threading

from engine.client import KVScopeClient
from engine.events.folds.reducer import PoolState


def _workload(url: str, started: threading.Event, errors: list) -> None:
    try:
        with KVScopeClient(url, timeout=60) as c:
            rids = []
            for i in range(12):
                # shared prefixes (hits, evictions in a small pool), forks with n=2
                rids.append(c.submit("shared system prompt " + "abc"[i % 3] * (i + 1),
                                     params={"temperature": 0.8, "seed": i, "n": 1 + i % 2,
                                             "max_tokens": 6 + i % 5, "ignore_eos": True}))
                if i == 3:
                    started.set()
            for rid in rids:
                list(c.stream(rid))
    except BaseException as exc:
        errors.append(exc)
        started.set()


def test_late_joiner_snapshot_plus_steps_equals_fresh_snapshot(make_server):
    server = make_server(engine={"num_kv_blocks": 40, "max_num_batched_tokens": 16, "max_num_seqs": 6})
    started, errors = threading.Event(), []
    worker = threading.Thread(target=_workload, args=(server.url, started, errors))
    worker.start()
    assert started.wait(30)
    with KVScopeClient(server.url, timeout=60) as late:
        snap = late.initial_snapshot
        state = PoolState.from_snapshot(snap.state)
        worker.join(60)
        assert not errors, errors
        late.poll(0.5)  # the engine is idle now; collect the last steps
        fresh = late.snapshot()
        steps = [s for s in late.drain_steps() if s.seq > snap.seq]
        assert steps, "the late joiner should have seen steps"
        assert [s.seq for s in steps] == list(range(snap.seq + 1, fresh.seq + 1))
        for s in steps:
            state.apply_step(s)
        assert state.to_snapshot() == fresh.state
        kinds = {e.type for s in steps for e in s.events}
        assert {"block_allocated", "request_finished"} <= kinds

"""After every step, the state folded from events equals the scheduler's true state."""

import dataclasses

from hypothesis import HealthCheck, given, settings, strategies as st

from engine.events.folds.reducer import PoolState
from engine.events.schema.types import event_from_dict

from tests.core.driver import make_scheduler, req, step
from tests.core.test_invariants import STEMS, op, run_ops


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), prefix=st.booleans(), chunk=st.sampled_from([3, 8, 64]),
       n_sharing=st.sampled_from(["cow", "prefix_cache"]))
def test_reducer_rebuilds_engine_state_after_every_operation(ops, prefix, chunk, n_sharing):
    s = make_scheduler(block_size=4, num_blocks=10, max_model_len=40, budget=chunk, prefix=prefix,
                       max_num_seqs=4, n_sharing=n_sharing)
    state = PoolState(10, 4)
    seen = set()

    def check(_s):
        events = s.log.drain()
        seen.update(e.type for e in events)
        for e in events:  # through JSON, as the dashboard and replay receive them
            state.apply_event(event_from_dict(e.to_dict()))
        snap = s.snapshot()
        got = dataclasses.replace(state.to_snapshot(), step=snap.step)
        assert got == snap
        assert state.summary() == dataclasses.replace(s.pool_summary(), step=state.step)

    run_ops(s, ops, check)
    if n_sharing == "prefix_cache":  # vLLM v1: samples are requests; nothing forks or copies
        assert not seen & {"request_forked", "cow_copy"}


def test_workload_with_every_kind_of_event_agrees():
    """A fixed workload that surely hits, forks, copies, evicts and preempts."""
    s = make_scheduler(block_size=4, num_blocks=12, max_model_len=40, budget=16, max_num_seqs=6)
    state = PoolState(12, 4)
    kinds = set()
    script = [("a", STEMS[0] + [1, 2, 3], 1, 3), ("b", STEMS[0] + [4, 4], 3, 6),
              ("c", list(range(20, 38)), 1, 10), ("d", STEMS[0] + [1, 2, 3], 2, 12),
              ("e", list(range(50, 70)), 1, 8)]
    for rid, toks, n, mt in script:
        s.add_request(req(rid, toks, max_tokens=mt, n=n))
        step(s)
    for _ in range(200):
        events = s.log.drain()
        kinds.update(e.type for e in events)
        state.apply_events(events)
        snap = s.snapshot()
        got = dataclasses.replace(state.to_snapshot(), step=snap.step)
        assert got == snap
        if not s.has_unfinished_requests():
            break
        step(s)
    assert {"prefix_hit", "cow_copy", "block_evicted", "request_preempted", "request_forked"} <= kinds

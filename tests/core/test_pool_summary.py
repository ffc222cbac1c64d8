"""The live pool summary (from tables and the free queue) equals the one counted from
the full snapshot, after every operation, and is hand-checked on a small state."""

from hypothesis import HealthCheck, given, settings, strategies as st

from engine.events.metrics.pool_summary import PoolSummary

from tests.core.driver import make_scheduler, req, step
from tests.core.test_invariants import op, run_ops


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), prefix=st.booleans(), chunk=st.sampled_from([3, 8, 64]))
def test_live_summary_equals_snapshot_summary_after_every_operation(ops, prefix, chunk):
    s = make_scheduler(block_size=4, num_blocks=10, max_model_len=40, budget=chunk, prefix=prefix,
                       max_num_seqs=4)

    def check(_s):
        assert s.pool_summary() == s.snapshot(tokens=False).summary()

    run_ops(s, ops, check)


def test_summary_of_shared_partial_and_cached_blocks():
    """Two requests share a 2-block prefix; a third finished and left cached blocks."""
    s = make_scheduler(block_size=4, num_blocks=12, max_model_len=40, budget=64, max_num_seqs=4)
    s.add_request(req("old", list(range(100, 109)), max_tokens=1))  # step 1; 9 tokens: 2 full blocks + 1
    step(s)
    while s.has_unfinished_requests():
        step(s)
    prefix = list(range(8))
    s.add_request(req("a", prefix + [50], max_tokens=5))
    step(s)  # a computes 9 tokens: blocks 0..1 full, cached; a third holds 1
    s.add_request(req("b", prefix + [60, 61], max_tokens=5))
    out = s.schedule()  # b hits a's two full blocks, computes its 2 own tokens
    assert [x.request_id for x in out.scheduled] == ["a", "b"]
    got = s.pool_summary()
    a_table, b_table = (tuple(b.id for b in s.kv.tables[r]) for r in ("a", "b"))
    assert a_table[:2] == b_table[:2] and a_table[2] != b_table[2]
    # a: 9 computed (a decode of its 10th is scheduled, not yet computed); b: 8 from cache
    assert got == PoolSummary(
        step=3, block_size=4, num_blocks=12, num_used_blocks=4,
        num_filled_slots=8 + 1 + 0, num_shared_blocks=2,
        num_cached_free_blocks=2,  # "old"'s two full blocks, freed but hittable
        num_requests_waiting=0, num_requests_running=2, num_requests_preempted=0,
    )
    assert got == s.snapshot().summary()
    figures = got.figures()
    assert figures["kv_cache_usage"] == 4 / 12
    assert figures["internal_fragmentation"] == 1 - 9 / 16

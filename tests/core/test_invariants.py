"""Property test: random operation sequences never break the pool's invariants."""

from collections import Counter

from hypothesis import HealthCheck, given, settings, strategies as st

from engine.core import RequestStatus
from engine.core.hashing import hash_block

from tests.core.driver import make_scheduler, req, step

# a tiny alphabet and a few shared stems make prefix hits and evictions common
STEMS = [list(range(8)), [1, 2, 3, 4, 5, 6], [9, 9, 9]]

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.lists(st.integers(0, 5), max_size=14),
              st.integers(1, 3), st.integers(1, 8)),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("reset")),
)


def check_invariants(s):
    pool, bs = s.kv.pool, s.kv.block_size
    free_ids = pool.free_queue.ids()
    assert len(free_ids) == len(set(free_ids)), "a block appears twice in the free queue"
    holders = Counter(b.id for t in s.kv.tables.values() for b in t)
    for b in pool.blocks:
        assert (b.ref_count == 0) == (b.id in set(free_ids)), f"{b} is both/neither free and used"
        assert b.ref_count == holders.get(b.id, 0), f"{b}: ref {b.ref_count} != holders"
    assert len(free_ids) + sum(1 for b in pool.blocks if b.ref_count) == len(pool.blocks)
    assert pool.num_cached_free == sum(1 for b in pool.blocks if b.ref_count == 0 and b.hash)
    for h, b in pool.cached.items():
        assert b.hash == h and hash_block(b.parent_hash, b.token_ids) == h
    for rid, table in s.kv.tables.items():
        r = s.requests[rid]
        assert len(table) * bs >= r.num_computed_tokens
        for i, b in enumerate(table):
            if b.hash is not None and (i + 1) * bs <= r.num_computed_tokens:
                assert list(b.token_ids) == r.token_ids[i * bs:(i + 1) * bs]
    for r in s.waiting:
        assert r.request_id not in s.kv.tables or not s.kv.tables[r.request_id]


def run_ops(s, ops, check) -> None:
    """Apply hypothesis ``ops`` to scheduler ``s``, then step it dry; ``check(s)`` after each."""
    n = 0
    for o in ops:
        if o[0] == "add":
            _, stem, tail, nsamp, max_tokens = o
            s.add_request(req(f"r{n}", STEMS[stem] + tail, max_tokens=max_tokens, n=nsamp))
            n += 1
        elif o[0] == "step":
            step(s)
        elif o[0] == "abort" and s.requests:
            rid = sorted(s.requests)[o[1] % len(s.requests)]
            s.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        elif o[0] == "reset":
            s.kv.reset_prefix_cache()
        check(s)
    for _ in range(400):
        if not s.has_unfinished_requests():
            break
        step(s)
        check(s)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), prefix=st.booleans(), chunk=st.sampled_from([3, 8, 64]),
       n_sharing=st.sampled_from(["cow", "prefix_cache"]))
def test_random_operations_keep_invariants(ops, prefix, chunk, n_sharing):
    s = make_scheduler(block_size=4, num_blocks=10, max_model_len=40, budget=chunk, prefix=prefix,
                       max_num_seqs=4, n_sharing=n_sharing)
    run_ops(s, ops, check_invariants)
    assert not s.has_unfinished_requests()
    assert s.kv.pool.num_free == 10

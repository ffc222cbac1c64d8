"""Exact block ids, ref counts and free-queue order on tiny pools (block_size 4)."""

from engine.core import EventLog, KVCacheManager, CacheConfig, RequestStatus
from engine.events.schema.types import BlockEvicted, CowCopy, PrefixCacheReset

from tests.core.driver import make_scheduler, req, run_all, step, tokens


def refs(s):
    return {b.id: b.ref_count for b in s.kv.pool.blocks if b.ref_count}


def test_allocation_and_freeing_exact_ids_without_caching():
    s = make_scheduler(num_blocks=8, max_model_len=32, prefix=False)
    s.add_request(req("a", range(10), max_tokens=1))
    s.add_request(req("b", range(100, 106), max_tokens=5))
    out, _, finished = step(s)
    assert [x.block_table for x in out.scheduled] == [[0, 1, 2], [3, 4]]
    assert out.scheduled[0].slot_mapping == list(range(10))
    assert out.scheduled[1].slot_mapping == [12, 13, 14, 15, 16, 17]
    assert [r.request_id for r in finished] == ["a"]
    # freed tail first; uncached blocks go to the head, so 0, 1, 2 are reused first
    assert s.kv.pool.free_queue.ids() == [0, 1, 2, 5, 6, 7]
    assert refs(s) == {3: 1, 4: 1}


def test_free_with_caching_puts_full_blocks_at_tail_tail_first():
    s = make_scheduler(num_blocks=8, max_model_len=32)
    s.add_request(req("a", range(10), max_tokens=1))
    step(s)
    # blocks 0, 1 are full and cached (tail, freed in reverse), block 2 is partial (head)
    assert s.kv.pool.free_queue.ids() == [2, 3, 4, 5, 6, 7, 1, 0]
    assert {b.id for b in s.kv.pool.cached.values()} == {0, 1}


def test_shared_two_and_a_half_blocks_hit_exactly_two():
    s = make_scheduler(num_blocks=16)
    s.add_request(req("a", range(10), max_tokens=1))
    step(s)
    free_before = s.kv.pool.free_queue.ids()
    assert 0 in free_before and 1 in free_before  # freed but not evicted
    s.add_request(req("b", list(range(10)) + [50, 51, 52, 53, 54, 55], max_tokens=2))
    out, _, _ = step(s)
    (sb,) = out.scheduled
    b = s.requests["b"]
    assert b.num_cached_tokens == 8
    assert sb.start_position == 8 and sb.token_ids == [8, 9, 50, 51, 52, 53, 54, 55]
    assert sb.block_table[:2] == [0, 1]
    assert refs(s)[0] == 1 and refs(s)[1] == 1
    assert 0 not in s.kv.pool.free_queue.ids() and 1 not in s.kv.pool.free_queue.ids()
    lookup = [e for e in s.log.drain() if e.type == "prefix_lookup"][-1]
    assert (lookup.num_query_tokens, lookup.num_hit_tokens) == (16, 8)
    # block 2 [8, 9, 50, 51] was never cached (a's block 2 never filled) -> cold;
    # block 3 holds the last prompt token, which is always recomputed -> partial
    assert (lookup.miss_cold, lookup.miss_partial, lookup.miss_evicted) == (4, 4, 0)


def test_fully_shared_prompt_hits_at_most_len_minus_one_rounded_down():
    s = make_scheduler(num_blocks=16)
    s.add_request(req("a", range(12), max_tokens=1))
    step(s)
    assert len(s.kv.pool.cached) == 3
    s.add_request(req("b", range(12), max_tokens=1))
    out, _, _ = step(s)
    assert s.requests == {} and out.scheduled[0].start_position == 8
    assert out.scheduled[0].token_ids == [8, 9, 10, 11]
    lookup = [e for e in s.log.drain() if e.type == "prefix_lookup"][-1]
    assert lookup.num_hit_tokens == 8 and lookup.miss_partial == 4
    # 13 tokens: (13 - 1) // 4 = 3 blocks may hit
    s.add_request(req("c", range(13), max_tokens=1))
    out, _, _ = step(s)
    assert out.scheduled[0].start_position == 12


def test_lru_eviction_takes_uncached_first_then_tails_before_heads():
    s = make_scheduler(num_blocks=8, max_model_len=32)
    s.add_request(req("a", range(12), max_tokens=1))
    step(s)
    assert s.kv.pool.free_queue.ids() == [3, 4, 5, 6, 7, 2, 1, 0]
    s.add_request(req("c", range(100, 120), max_tokens=1))
    out, _, _ = step(s)
    assert out.scheduled[0].block_table == [3, 4, 5, 6, 7]
    assert s.kv.pool.free_queue.ids() == [2, 1, 0, 7, 6, 5, 4, 3]
    assert not [e for e in s.log.drain() if isinstance(e, BlockEvicted)]
    s.add_request(req("d", range(200, 208), max_tokens=4))
    out, _, _ = step(s)
    evicted = [(e.block, e.reason) for e in s.log.drain() if isinstance(e, BlockEvicted)]
    assert evicted == [(2, "reuse"), (1, "reuse")]  # a's tail block goes first, head 0 survives
    assert {b.id for b in s.kv.pool.cached.values()} >= {0}
    assert out.scheduled[-1].block_table == [2, 1]


def test_evicted_prefix_is_reported_as_evicted_miss():
    s = make_scheduler(num_blocks=8, max_model_len=32)
    s.add_request(req("a", range(12), max_tokens=1))
    step(s)
    s.add_request(req("fill", range(100, 128), max_tokens=1))  # 7 blocks: evicts a's 2, 1
    step(s)
    assert [e.block for e in s.log.drain() if e.type == "block_evicted"] == [2, 1]
    s.add_request(req("a2", range(12), max_tokens=1))
    step(s)
    lookup = [e for e in s.log.drain() if e.type == "prefix_lookup"][-1]
    assert lookup.num_hit_tokens == 4  # a's head block survived
    assert lookup.miss_evicted == 4 and lookup.miss_partial == 4 and lookup.miss_cold == 0


def test_cow_fork_partial_last_block_one_copy_parent_untouched():
    log = EventLog()
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=8), log)
    parent = req("p", range(6))
    assert kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    parent.token_ids.append(7)
    child = parent.fork(1)
    kv.fork(parent, child)
    assert kv.block_ids("p") == kv.block_ids("p#1") == [0, 1]
    assert [b.ref_count for b in kv.pool.blocks[:2]] == [2, 2]
    # the child writes position 6, inside shared partial block 1
    log.drain()
    assert kv.allocate_slots(child, 1)
    assert kv.take_cow_pairs() == [(1, 2)]
    # one self-contained event: the reference moved, nothing was freed
    assert log.drain() == [CowCopy(log.step, "p#1", src=1, dst=2, logical_index=1,
                                   src_ref_count=1)]
    assert kv.block_ids("p") == [0, 1]  # parent's block untouched
    assert kv.block_ids("p#1") == [0, 2]
    assert [b.ref_count for b in kv.pool.blocks[:3]] == [2, 1, 1]
    # the parent is now the only owner of block 1: writing needs no copy
    assert kv.allocate_slots(parent, 1)
    assert kv.take_cow_pairs() == [] and log.counts.cow_copies == 1


def test_scheduler_fork_n2_records_one_copy_and_finishes_both():
    s = make_scheduler(num_blocks=8, max_model_len=32)
    s.add_request(req("a", range(6), max_tokens=3, n=2))
    out, children, _ = step(s)
    assert out.scheduled[0].num_samples == 2
    assert [c.request_id for c in children] == ["a#1"]
    assert s.kv.block_ids("a") == s.kv.block_ids("a#1") == [0, 1]
    out, _, _ = step(s)
    assert out.cow_pairs == [(1, 2)]
    assert s.kv.block_ids("a") == [0, 2] and s.kv.block_ids("a#1") == [0, 1]
    run_all(s)
    assert s.kv.pool.num_free == 8 and s.log.counts.cow_copies == 1


def test_reset_prefix_cache_drops_all_hashes():
    s = make_scheduler(num_blocks=8, max_model_len=32)
    s.add_request(req("a", range(12), max_tokens=1))
    step(s)
    s.log.drain()
    assert s.kv.reset_prefix_cache() == 3
    assert s.kv.pool.cached == {} and all(b.hash is None for b in s.kv.pool.blocks)
    events = s.log.drain()
    assert [(e.block, e.reason) for e in events if isinstance(e, BlockEvicted)] == \
        [(0, "reset"), (1, "reset"), (2, "reset")]
    assert isinstance(events[-1], PrefixCacheReset)
    assert (s.log.counts.num_reset_evictions, s.log.counts.num_evictions) == (3, 0)
    s.add_request(req("b", range(12), max_tokens=1))
    step(s)
    assert s.log.drain()  # events keep flowing
    assert RequestStatus.FINISHED_LENGTH.finish_reason == "length"


def test_request_admitted_in_the_same_step_hits_blocks_this_step_computes():
    """As in vLLM, blocks are hashed when scheduled: b, admitted right after a in one
    step, already shares a's two full prompt blocks (their K/V is written by the same
    forward before any token attends)."""
    s = make_scheduler(num_blocks=16)
    s.add_request(req("a", range(10), max_tokens=2))
    s.add_request(req("b", list(range(8)) + [70, 71, 72], max_tokens=2))
    out = s.schedule()
    sa, sb = out.scheduled
    assert sa.block_table == [0, 1, 2] and sa.token_ids == list(range(10))
    assert sb.block_table == [0, 1, 3] and sb.start_position == 8 and sb.token_ids == [70, 71, 72]
    assert refs(s) == {0: 2, 1: 2, 2: 1, 3: 1}
    assert s.requests["b"].num_cached_tokens == 8
    events = s.log.drain()
    cached = [e.block for e in events if e.type == "block_cached"]
    assert cached == [0, 1]  # a's full blocks, hashed at allocation, before b's lookup
    lookup = [e for e in events if e.type == "prefix_lookup"][-1]
    assert (lookup.request_id, lookup.num_hit_tokens) == ("b", 8)


def test_a_failed_forward_forgets_the_hashes_it_never_computed():
    s = make_scheduler(num_blocks=16)
    s.add_request(req("a", range(6), max_tokens=1))
    step(s)  # block 0 computed and cached in a completed step
    s.add_request(req("b", range(20, 30), max_tokens=1))
    s.schedule()  # hashes b's blocks 1, 2 ... and the forward fails
    assert {b.id for b in s.kv.pool.cached.values()} == {0, 1, 2}
    s.log.drain()
    assert s.kv.uncache_uncomputed() == 2
    assert [(e.block, e.reason) for e in s.log.drain()] == [(1, "rollback"), (2, "rollback")]
    assert {b.id for b in s.kv.pool.cached.values()} == {0}
    assert s.log.counts.num_evictions == 0  # withdrawn hashes are no LRU evictions
    assert s.log.counts.num_rollback_evictions == 2
    # nothing is left to forget once a step's forward has run
    s.add_request(req("c", range(40, 50), max_tokens=1))
    s.update_from_output(s.schedule(), tokens({"b": 1, "c": 1}))
    assert s.kv.uncache_uncomputed() == 0

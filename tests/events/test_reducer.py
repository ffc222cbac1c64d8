"""The reducer on hand-built event sequences, with exact expected state."""

import copy

import pytest

from engine.events.folds.reducer import (
    ImpossibleEventError, PoolState,
)
from engine.events.schema.step import StepRecord
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, PrefixCacheReset, PrefixHit,
    PrefixLookup, RequestArrived, RequestFinished, RequestForked, RequestPreempted,
    RequestProgress, RequestScheduled,
)

BS = 4


def fold(events, num_blocks=6, block_size=BS):
    s = PoolState(num_blocks, block_size)
    s.apply_events(events)
    s.check()
    return s.to_snapshot()


def replay(snapshot, events):
    """The snapshot after folding ``events`` onto ``snapshot`` (which stays untouched)."""
    s = PoolState.from_snapshot(snapshot)
    s.apply_events(events)
    return s.to_snapshot()


def empty_state(num_blocks, block_size):
    return PoolState(num_blocks, block_size).to_snapshot()


def admit(rid, blocks, num_prompt, step=1, first_logical=0):
    """Arrival, miss-only lookup, allocation of ``blocks``, scheduling."""
    evs = [RequestArrived(step, rid, num_prompt, tuple(range(100, 100 + num_prompt))),
           PrefixLookup(step, rid, num_prompt, 0, num_prompt, 0, 0, 0)]
    evs += [BlockAllocated(step, b, rid, first_logical + i) for i, b in enumerate(blocks)]
    evs.append(RequestScheduled(step, rid, num_prompt, "prefill", 0))
    return evs


def test_empty_state():
    s = empty_state(3, BS)
    assert s.to_dict() == {
        "step": 0, "block_size": BS, "num_blocks": 3,
        "blocks": [{"id": i, "ref_count": 0, "hash": None, "num_tokens": 0, "token_ids": None}
                   for i in range(3)],
        "free_queue": [0, 1, 2], "requests": {},
    }


def test_allocation_progress_and_caching():
    evs = admit("a", [0, 1], 6) + [
        RequestProgress(1, "a", 7, 6, (900,)),
        BlockCached(1, 0, "h0", None, (100, 101, 102, 103)),
    ]
    s = fold(evs)
    assert s.step == 1
    assert s.free_queue == (2, 3, 4, 5)
    assert [b.ref_count for b in s.blocks] == [1, 1, 0, 0, 0, 0]
    assert s.blocks[0].to_dict() == {"id": 0, "ref_count": 1, "hash": "h0", "num_tokens": 4,
                                     "token_ids": [100, 101, 102, 103]}
    assert s.blocks[1].num_tokens == 2 and s.blocks[1].token_ids is None
    assert s.requests["a"].to_dict() == {
        "status": "running", "block_table": [0, 1], "num_tokens": 7, "num_computed_tokens": 6,
        "num_cached_tokens": 0, "token_ids": [100, 101, 102, 103, 104, 105, 900],
        "parent_id": None, "arrival_index": 0}


def test_free_order_hashless_to_head_hashed_to_tail_and_finish():
    evs = admit("a", [0, 1, 2], 10) + [
        RequestProgress(1, "a", 11, 10, (7,)),
        BlockCached(1, 0, "h0", None, (100, 101, 102, 103)),
        BlockCached(1, 1, "h1", "h0", (104, 105, 106, 107)),
        # freed tail first, as the engine does
        BlockFreed(2, 2, "a", 0), BlockFreed(2, 1, "a", 0), BlockFreed(2, 0, "a", 0),
        RequestFinished(2, "a", "length"),
    ]
    s = fold(evs)
    assert s.free_queue == (2, 3, 4, 5, 1, 0)  # 2 (no hash) at the head; 1, 0 at the tail
    assert s.requests == {}
    assert [b.hash for b in s.blocks[:3]] == ["h0", "h1", None]
    # free cached blocks hold a full block; a free hashless one holds nothing
    assert [b.num_tokens for b in s.blocks[:3]] == [BS, BS, 0]


def test_prefix_hit_takes_free_cached_block_out_of_the_middle_of_the_queue():
    evs = admit("a", [0, 1], 8) + [
        RequestProgress(1, "a", 9, 8, (7,)),
        BlockCached(1, 0, "h0", None, (100, 101, 102, 103)),
        BlockCached(1, 1, "h1", "h0", (104, 105, 106, 107)),
        BlockFreed(2, 1, "a", 0), BlockFreed(2, 0, "a", 0),
        RequestFinished(2, "a", "stop"),
        RequestArrived(3, "b", 6, arrival_index=1),
        PrefixLookup(3, "b", 6, 4, 0, 0, 2, 0),
        PrefixHit(3, "b", (0,), 4),
        BlockAllocated(3, 2, "b", 1),
        RequestScheduled(3, "b", 2, "prefill", 4),
    ]
    s = fold(evs)
    assert s.free_queue == (3, 4, 5, 1)  # 0 left from between 5 and the tail
    r = s.requests["b"]
    assert r.block_table == (0, 2)
    assert (r.num_cached_tokens, r.num_computed_tokens, r.status) == (4, 4, "running")
    assert s.blocks[0].ref_count == 1 and s.blocks[0].hash == "h0"


def test_eviction_then_reuse_of_a_cached_block():
    evs = admit("a", [0], 4) + [
        RequestProgress(1, "a", 5, 4, (7,)),
        BlockCached(1, 0, "h0", None, (100, 101, 102, 103)),
        BlockFreed(2, 0, "a", 0), RequestFinished(2, "a", "stop"),
    ]
    s = fold(evs, num_blocks=1)
    assert s.free_queue == (0,) and s.blocks[0].hash == "h0"
    after = replay(s, admit("b", [], 3, step=3)
                   + [BlockEvicted(3, 0, "h0", "reuse"), BlockAllocated(3, 0, "b", 0)])
    assert after.free_queue == ()
    assert after.blocks[0].to_dict() == {"id": 0, "ref_count": 1, "hash": None,
                                         "num_tokens": 0, "token_ids": None}
    with pytest.raises(ImpossibleEventError, match="block_evicted must come first"):
        replay(s, admit("b", [0], 3, step=3))


def test_fork_shares_every_block_and_cow_copy_moves_the_reference():
    evs = admit("p", [0, 1], 6) + [
        RequestProgress(1, "p", 7, 6, (9,)),
        RequestForked(2, "p.1", "p", (0, 1), 7, 6, (1, 2, 3, 4, 5, 6, 9), 1),
    ]
    s = fold(evs)
    assert [b.ref_count for b in s.blocks[:2]] == [2, 2]
    assert s.requests["p.1"].status == "running"
    assert s.requests["p.1"].parent_id == "p"
    assert s.blocks[1].num_tokens == 2
    # the child writes into shared block 1 first: it gets a private copy (dst 2)
    s2 = replay(s, [CowCopy(3, "p.1", 1, 2, 1, src_ref_count=1)])
    assert s2.requests["p.1"].block_table == (0, 2)
    assert s2.requests["p"].block_table == (0, 1)
    assert [b.ref_count for b in s2.blocks[:3]] == [2, 1, 1]
    assert s2.free_queue == (3, 4, 5)
    # a v1 engine released src with a block_freed right before the cow_copy: decoding
    # that step body upgrades it to the one v2 event, and the state is the same
    v1 = StepRecord.from_dict({"seq": 0, "step": 3, "ts": 0.0, "events": [
        {"type": "block_freed", "step": 3, "block": 1, "request_id": "p.1", "ref_count": 1},
        {"type": "cow_copy", "step": 3, "request_id": "p.1", "src": 1, "dst": 2,
         "logical_index": 1}]})
    assert v1.events == [CowCopy(3, "p.1", 1, 2, 1, src_ref_count=1)]
    assert replay(s, v1.events) == s2
    # the count after the move must be right, and a block is never freed mid-table
    with pytest.raises(ImpossibleEventError, match="drops to 2"):
        replay(s, [CowCopy(3, "p.1", 1, 2, 1, src_ref_count=2)])
    with pytest.raises(ImpossibleEventError, match="not the last block"):
        replay(s, [BlockFreed(3, 0, "p.1", 1)])


def test_cow_copy_needs_a_shared_src():
    s = fold(admit("a", [0], 3))
    with pytest.raises(ImpossibleEventError, match="needs > 1"):
        replay(s, [CowCopy(2, "a", 0, 1, 0, src_ref_count=0)])


def test_preemption_frees_then_requeues():
    evs = admit("a", [0, 1], 6) + [
        RequestProgress(1, "a", 7, 6, (9,)),
        BlockFreed(2, 1, "a", 0), BlockFreed(2, 0, "a", 0),
        RequestPreempted(2, "a"),
    ]
    s = fold(evs)
    r = s.requests["a"]
    assert (r.status, r.block_table, r.num_computed_tokens, r.num_tokens) == \
        ("preempted", (), 0, 7)
    assert s.free_queue == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ImpossibleEventError, match="still holds blocks"):
        fold(admit("a", [0], 3) + [RequestPreempted(2, "a")])


def test_shared_block_fill_is_the_max_over_holders():
    evs = admit("p", [0, 1], 5) + [
        RequestProgress(1, "p", 6, 5, (9,)),
        RequestForked(1, "c", "p", (0, 1), 6, 5, (), 1),
        RequestProgress(2, "c", 6, 3, ()),  # contrived: c computed fewer
    ]
    s = fold(evs)
    assert [b.num_tokens for b in s.blocks[:2]] == [4, 1]


def test_prefix_cache_reset_drops_every_hash():
    evs = admit("a", [0, 1], 8) + [
        RequestProgress(1, "a", 9, 8, (7,)),
        BlockCached(1, 0, "h0", None, (1, 2, 3, 4)),
        BlockCached(1, 1, "h1", "h0", (5, 6, 7, 8)),
        BlockFreed(2, 1, "a", 0),  # contrived partial free to get a free cached block
    ]
    s = PoolState(4, BS)
    s.apply_events(evs)
    s.apply_events([BlockEvicted(3, 0, "h0", "reset"), BlockEvicted(3, 1, "h1", "reset"),
                    PrefixCacheReset(3)])
    snap = s.to_snapshot()
    assert [b.hash for b in snap.blocks] == [None] * 4
    assert snap.free_queue == (2, 3, 1)  # queue order is untouched by the reset
    s2 = PoolState(4, BS)
    s2.apply_events(evs)
    with pytest.raises(ImpossibleEventError, match="still hold hashes"):
        s2.apply_event(PrefixCacheReset(3))


@pytest.mark.parametrize("bad, match", [
    (BlockAllocated(2, 0, "a", 1), "expected a free block"),
    (BlockAllocated(2, 3, "a", 5), "appends at 5"),
    (BlockAllocated(2, 3, "zz", 0), "unknown request"),
    (BlockAllocated(2, 99, "a", 1), "no block 99"),
    (BlockFreed(2, 0, "a", 1), "drops to 1"),
    (BlockFreed(2, 3, "a", 0), "ref_count 0"),
    (BlockCached(2, 3, "h", None, ()), "is free"),
    (BlockEvicted(2, 0, "nope"), "holds hash None"),
    (BlockFreed(2, 0, "zz", 0), "unknown request"),
    (PrefixHit(2, "a", (3,), 4), "already holds blocks"),
    (RequestArrived(2, "a", 3), "exists"),
    (RequestFinished(2, "a", "stop"), "still holds blocks"),
])
def test_impossible_events_raise(bad, match):
    s = PoolState(4, BS)
    s.apply_events(admit("a", [0], 3))
    with pytest.raises(ImpossibleEventError, match=match):
        s.apply_event(bad)


def test_hit_on_uncached_block_raises():
    s = PoolState(4, BS)
    s.apply_event(RequestArrived(1, "a", 6))
    with pytest.raises(ImpossibleEventError, match="not cached"):
        s.apply_event(PrefixHit(1, "a", (2,), 4))


def test_folding_from_a_snapshot_leaves_it_untouched_and_equals_folding_at_once():
    evs = admit("a", [0, 1], 6) + [RequestProgress(1, "a", 7, 6, (9,))]
    state = empty_state(6, BS)
    for e in evs:  # one event at a time, through snapshots; dict events fold like typed ones
        before = copy.deepcopy(state)
        s = PoolState.from_snapshot(state)
        s.apply_event(e.to_dict() if e.type == "block_allocated" else e)
        assert state == before  # input untouched
        state = s.to_snapshot()
    assert state == replay(empty_state(6, BS), evs) == fold(evs)


def test_from_snapshot_round_trip_and_copy_independence():
    evs = admit("p", [0, 1], 6) + [RequestForked(1, "c", "p", (0, 1), 6, 0, (), 1)]
    snap = fold(evs)
    s = PoolState.from_snapshot(snap)
    assert s.to_snapshot() == snap
    assert PoolState.from_snapshot(snap.to_dict()).to_snapshot() == snap  # the JSON form
    c = s.copy()
    c.apply_event(CowCopy(2, "c", 0, 2, 0, src_ref_count=1))
    assert s.to_snapshot() == snap
    bad = snap.to_dict()
    bad["blocks"][0]["ref_count"] = 1
    with pytest.raises(ImpossibleEventError, match="ref counts disagree"):
        PoolState.from_snapshot(bad)
    del bad["blocks"][0]["num_tokens"]
    with pytest.raises(ValueError, match="malformed pool snapshot"):
        PoolState.from_snapshot(bad)


def test_a_reuse_eviction_needs_a_free_block():
    s = PoolState(4, BS)
    s.apply_events(admit("a", [0], 4) + [BlockCached(1, 0, "h0", None, (1, 2, 3, 4))])
    with pytest.raises(ImpossibleEventError, match="only a free block is reused"):
        s.apply_event(BlockEvicted(2, 0, "h0", "reuse"))
    s.apply_event(BlockEvicted(2, 0, "h0", "rollback"))  # a withdrawn hash of a block in use
    assert s.hash[0] is None and s.ref[0] == 1

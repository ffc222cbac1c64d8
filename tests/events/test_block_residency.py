"""Block residency folded from events, with vLLM's definitions (kv_cache_metrics.py), exactly."""

import pytest

from engine.events.metrics.block_residency import BlockResidency, BlockTenure
from engine.events.schema import types as event_types


def alloc(block, rid="r", i=0):
    return event_types.BlockAllocated(0, block, rid, i)


def hit(*blocks, rid="h"):
    return event_types.PrefixHit(0, rid, tuple(blocks), 4 * len(blocks))


def test_lifetime_idle_and_reuse_gaps_of_one_block():
    r = BlockResidency()
    assert r.observe([alloc(3)], ts=10.0) == []  # first tenure of block 3 starts at 10
    assert r.observe([hit(3)], ts=11.0) == []
    assert r.observe([hit(3)], ts=13.5) == []
    assert r.observe([event_types.RequestForked(0, "c", "h", (3,), 8, 8)], ts=14.0) == []
    # handed out again at 20: lifetime 10, idle since the last access 6, gaps 2.5 and 0.5
    assert r.observe([alloc(3, "s")], ts=20.0) == [BlockTenure(3, 10.0, 6.0, (2.5, 0.5))]
    # the new tenure has no access: idle equals lifetime, no gap
    assert r.observe([alloc(3, "t")], ts=21.0) == [BlockTenure(3, 1.0, 1.0, ())]
    assert r.num_open == 1


def test_only_the_last_four_accesses_make_gaps():
    r = BlockResidency()
    r.observe([alloc(0)], 0.0)
    for ts in (1.0, 2.0, 4.0, 8.0, 16.0):
        r.observe([hit(0)], ts)
    (t,) = r.observe([alloc(0)], 20.0)
    assert t == BlockTenure(0, 20.0, 4.0, (2.0, 4.0, 8.0))  # accesses 2, 4, 8, 16


def test_cow_copy_hands_out_its_dst_and_one_step_shares_a_time():
    r = BlockResidency()
    r.observe([alloc(1), alloc(2)], 5.0)
    ended = r.observe([event_types.CowCopy(0, "c", 1, 2, 0, src_ref_count=1), alloc(1, "d")], 7.0)
    assert ended == [BlockTenure(2, 2.0, 2.0, ()), BlockTenure(1, 2.0, 2.0, ())]


def test_hits_on_blocks_never_handed_out_and_reset_forget_tenures():
    r = BlockResidency()
    r.observe([hit(9)], 1.0)  # nothing open for 9: ignored
    assert r.observe([alloc(9)], 2.0) == []
    r.observe([alloc(4)], 2.0)
    r.observe([event_types.BlockEvicted(0, 9, "h9", reason="reset"), event_types.PrefixCacheReset(0)], 3.0)
    assert r.num_open == 0
    assert r.observe([alloc(9), alloc(4)], 4.0) == []  # their tenures began before the reset
    assert r.observe([alloc(9)], 6.0) == [BlockTenure(9, 2.0, 2.0, ())]


def test_without_prefix_caching_nothing_is_observed_and_reset_starts_a_new_pool():
    r = BlockResidency(enable_prefix_caching=False)
    assert r.observe([alloc(0)], 0.0) == [] and r.observe([alloc(0)], 1.0) == []
    r.reset(enable_prefix_caching=True)
    r.observe([alloc(0)], 2.0)
    r.reset()  # a new run: block 0 is a different physical block now
    assert r.observe([alloc(0)], 3.0) == [] and r.enable_prefix_caching


@pytest.mark.parametrize("events", [[alloc(5)], [event_types.CowCopy(0, "c", 4, 5, 1, src_ref_count=1)]])
def test_every_hand_out_ends_the_previous_tenure_hashed_or_not(events):
    # vLLM's get_new_blocks ends a tenure on every popped block, not only on hashed ones
    r = BlockResidency()
    r.observe(events, 1.0)
    assert r.observe(events, 1.25) == [BlockTenure(5, 0.25, 0.25, ())]

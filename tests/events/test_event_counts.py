"""EventCounts reads each count off one event: the order of events does not matter."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.events.metrics.event_counts import EventCounts
from engine.events.schema.types import (
    BlockAllocated, BlockEvicted, BlockFreed, CowCopy, PrefixCacheReset, PrefixLookup,
    RequestFinished, RequestPreempted, RequestProgress, RequestScheduled,
)

EVENTS = [
    PrefixLookup(1, "a", 10, 4, 4, 0, 2, 0),
    PrefixLookup(1, "b", 9, 8, 0, 0, 1, 0, resumed=True),
    PrefixLookup(1, "c", 7, 0, 0, 0, 0, 7),  # prefix caching off
    PrefixLookup(1, "c", 8, 0, 0, 0, 0, 8, resumed=True),
    RequestScheduled(1, "a", 6, "prefill", 4), RequestScheduled(1, "d", 1, "decode", 9),
    BlockEvicted(1, 3, "h3", "reuse"), BlockAllocated(1, 3, "a", 1),
    BlockEvicted(1, 5, "h5", "reset"), BlockEvicted(1, 6, "h6", "reset"), PrefixCacheReset(1),
    BlockEvicted(1, 7, "h7", "rollback"), CowCopy(1, "d", 1, 2, 0, 1),
    BlockFreed(1, 9, "e", 0), RequestPreempted(1, "e"), RequestFinished(1, "f", "stop"),
    RequestProgress(1, "d", 11, 10, (5, 6)),
]
EXPECTED = EventCounts(
    prefix_cache_queries=10, prefix_cache_hits=4, prefix_cache_resumed_queries=9,
    prefix_cache_resumed_hits=8, prefix_cache_miss_cold=4, prefix_cache_miss_partial=2,
    prefix_cache_miss_disabled=7, num_preemptions=1, num_evictions=1, num_reset_evictions=2,
    num_rollback_evictions=1, cow_copies=1, prefix_cache_resets=1, num_requests_finished=1,
    num_output_tokens=2, num_prefill_tokens=6, num_decode_tokens=1)


def test_counts_of_a_mixed_step():
    assert EventCounts.of(EVENTS) == EXPECTED
    assert EXPECTED.prefix_cache_hit_rate == 0.4 and EventCounts().prefix_cache_hit_rate is None
    twice = EventCounts.of(EVENTS)
    twice.add_counts(EXPECTED)
    assert twice.to_dict() == {k: 2 * v for k, v in EXPECTED.to_dict().items()}


@settings(max_examples=50, deadline=None)
@given(st.permutations(EVENTS))
def test_no_count_depends_on_the_order_of_events(events):
    assert EventCounts.of(events) == EXPECTED

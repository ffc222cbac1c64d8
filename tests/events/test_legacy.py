"""Protocol v1 step bodies (runs recorded before v2) decode as v2 events."""

import pytest

from engine.events.schema.step import StepRecord
from engine.events.schema.types import BlockAllocated, BlockEvicted, CowCopy, PrefixCacheReset


def body(*events):
    return {"seq": 0, "step": 4, "ts": 0.0, "events": list(events)}


def ev(kind, **fields):
    return {"type": kind, "step": 4, **fields}


def test_v1_evictions_get_their_reason_from_what_follows_them():
    rec = StepRecord.from_dict(body(
        ev("block_evicted", block=3, hash="a"), ev("block_allocated", block=3, request_id="r",
                                                   logical_index=0),
        ev("block_evicted", block=1, hash="b"), ev("block_evicted", block=2, hash="c"),
        ev("prefix_cache_reset")))
    assert rec.events == [BlockEvicted(4, 3, "a", "reuse"), BlockAllocated(4, 3, "r", 0),
                          BlockEvicted(4, 1, "b", "reset"), BlockEvicted(4, 2, "c", "reset"),
                          PrefixCacheReset(4)]


def test_v1_cow_copy_takes_its_src_count_from_the_block_freed_before_it():
    rec = StepRecord.from_dict(body(
        ev("block_freed", block=1, request_id="p#1", ref_count=2),
        ev("cow_copy", request_id="p#1", src=1, dst=5, logical_index=1)))
    assert rec.events == [CowCopy(4, "p#1", 1, 5, 1, src_ref_count=2)]
    with pytest.raises(ValueError, match="without the block_freed"):
        StepRecord.from_dict(body(ev("cow_copy", request_id="p#1", src=1, dst=5,
                                     logical_index=1)))


def test_v2_bodies_pass_through_unchanged():
    events = [CowCopy(4, "p#1", 1, 5, 1, 2).to_dict(),
              BlockEvicted(4, 3, "a", "rollback").to_dict()]
    assert [e.to_dict() for e in StepRecord.from_dict(body(*events)).events] == events

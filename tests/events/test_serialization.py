"""JSON round trip of every event type and of StepRecord."""

import json

import pytest

from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.reducer import PoolState
from engine.events.schema.step import StepRecord
from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, BlockFreed, CowCopy, EVENT_TYPES,
    PrefixCacheReset, PrefixHit, PrefixLookup, RequestArrived, RequestFinished, RequestForked,
    RequestPreempted, RequestProgress, RequestScheduled, event_from_dict,
    EvictionReason, ScheduledPhase, KVAllCleared, KVBlockRemoved, KVBlockStored, KVGap, KVSegment,
)

EXAMPLES = [
    BlockAllocated(1, 3, "r", 0),
    BlockFreed(2, 3, "r", 0),
    BlockCached(1, 3, "abc", None, (1, 2, 3, 4)),
    BlockCached(1, 4, "def", "abc", (5, 6, 7, 8)),
    BlockEvicted(3, 3, "abc"),
    BlockEvicted(3, 4, "def", "reset"),
    BlockEvicted(3, 5, "0af", "rollback"),
    PrefixHit(4, "s", (3, 4), 8),
    PrefixLookup(4, "s", 10, 8, 0, 0, 2, 0),
    PrefixLookup(4, "s", 11, 8, 0, 0, 3, 0, resumed=True),
    CowCopy(5, "s", 4, 7, 1, 2),
    PrefixCacheReset(6),
    RequestArrived(1, "r", 4, (1, 2, 3, 4), 0),
    RequestForked(2, "r.1", "r", (3,), 5, 4, (1, 2, 3, 4, 9), 1),
    RequestScheduled(1, "r", 4, "prefill", 0),
    RequestScheduled(2, "r", 1, "decode", 4),
    RequestProgress(1, "r", 5, 4, (9,)),
    RequestPreempted(2, "r"),
    RequestFinished(3, "r", "length"),
    KVBlockStored(7, "pod-a", ("00000000000000a1", "00000000000000a2"), None, (1, 2, 3, 4), 2,
                  1700000000.5, "GPU"),
    KVBlockStored(8, "pod-a", ("ab" * 32,), "00000000000000a2", (5, 6), 2, 1700000001.0, None, "lora"),
    KVBlockRemoved(9, "pod-a", ("00000000000000a1",), 1700000002.0, "GPU"),
    KVAllCleared(10, "pod-b", 1700000003.0),
    KVGap(11, "pod-a", 0, 4, 7, "not in the replay buffer"),
    KVSegment(12, "pod-b", 1, 0, "restart"),
]


def test_examples_cover_every_event_type():
    assert {type(e) for e in EXAMPLES} == set(EVENT_TYPES.values())


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_event_json_round_trip(event):
    text = json.dumps(event.to_dict())
    back = event_from_dict(json.loads(text))
    assert back == event and type(back) is type(event)


def test_step_record_round_trip():
    rec = StepRecord(seq=7, step=9, ts=1700000000.25, events=list(EXAMPLES),
                     metrics={"kv_cache_usage": 0.5, "ttft_s": [0.1], "hit": None})
    back = StepRecord.from_json(rec.to_json())
    assert back == rec
    assert StepRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec


def test_step_record_accepts_event_dicts_and_validates():
    rec = StepRecord(0, 1, 0.0, [EXAMPLES[0].to_dict()])
    assert rec.events == [EXAMPLES[0]]
    with pytest.raises(ValueError, match="seq"):
        StepRecord(-1, 1, 0.0)
    with pytest.raises(ValueError, match="unknown event type"):
        StepRecord.from_dict({"seq": 0, "step": 1, "ts": 0, "events": [{"type": "nope"}]})


def test_new_fields_on_the_wire_exactly():
    """The v2 fields as JSON (plain strings for the enums) and their vocabularies."""
    assert BlockEvicted(3, 4, "def", "reset").to_dict() == {
        "type": "block_evicted", "step": 3, "block": 4, "hash": "def", "reason": "reset"}
    assert CowCopy(5, "s", 4, 7, 1, 2).to_dict() == {
        "type": "cow_copy", "step": 5, "request_id": "s", "src": 4, "dst": 7,
        "logical_index": 1, "src_ref_count": 2}
    lookup = PrefixLookup(4, "s", 11, 8, 0, 0, 3, 0, resumed=True).to_dict()
    assert lookup["resumed"] is True and json.loads(json.dumps(lookup)) == lookup
    assert type(RequestScheduled(1, "r", 4, "prefill").to_dict()["phase"]) is str
    assert {r.value for r in EvictionReason} == {"reuse", "reset", "rollback"}
    assert {p.value for p in ScheduledPhase} == {"prefill", "decode"}
    for bad in ({"type": "block_evicted", "step": 1, "block": 0, "hash": "h", "reason": "lru"},
                {"type": "request_scheduled", "step": 1, "request_id": "r", "num_tokens": 1,
                 "phase": "chunk"},
                {"type": "cow_copy", "step": 1, "request_id": "r", "src": 0, "dst": 1}):
        with pytest.raises(ValueError):
            event_from_dict(bad)


def test_pool_snapshot_json_round_trip():
    state = PoolState(4, 4)
    state.apply_events([RequestArrived(1, "r", 5, (1, 2, 3, 4, 5)),
                        PrefixLookup(1, "r", 5, 0, 4, 0, 1, 0),
                        BlockAllocated(1, 0, "r", 0), BlockAllocated(1, 1, "r", 1),
                        RequestScheduled(1, "r", 5, "prefill"),
                        RequestProgress(1, "r", 6, 5, (9,)),
                        BlockCached(1, 0, "abc", None, (1, 2, 3, 4)),
                        RequestForked(1, "r#1", "r", (0, 1), 6, 5, (1, 2, 3, 4, 5, 9), 0)])
    snap = state.to_snapshot()
    wire = json.loads(json.dumps(snap.to_dict()))
    assert PoolSnapshot.from_dict(wire) == snap
    assert wire["requests"]["r#1"]["status"] == "running"
    assert wire["blocks"][1] == {"id": 1, "ref_count": 2, "hash": None, "num_tokens": 1,
                                 "token_ids": None}

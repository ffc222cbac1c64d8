"""JSON round trip of every event type and of StepRecord."""

import json

import pytest

from engine.events import types as T
from engine.events.step import StepRecord

EXAMPLES = [
    T.BlockAllocated(1, 3, "r", 0),
    T.BlockFreed(2, 3, "r", 0),
    T.BlockCached(1, 3, "abc", None, (1, 2, 3, 4)),
    T.BlockCached(1, 4, "def", "abc", (5, 6, 7, 8)),
    T.BlockEvicted(3, 3, "abc"),
    T.PrefixHit(4, "s", (3, 4), 8),
    T.PrefixLookup(4, "s", 10, 8, 0, 0, 2, 0),
    T.CowCopy(5, "s", 4, 7, 1),
    T.PrefixCacheReset(6),
    T.RequestArrived(1, "r", 4, (1, 2, 3, 4), 0),
    T.RequestForked(2, "r.1", "r", (3,), 5, 4, (1, 2, 3, 4, 9), 1),
    T.RequestScheduled(1, "r", 4, "prefill", 0),
    T.RequestProgress(1, "r", 5, 4, (9,)),
    T.RequestPreempted(2, "r"),
    T.RequestFinished(3, "r", "length"),
]


def test_examples_cover_every_event_type():
    assert {type(e) for e in EXAMPLES} == set(T.EVENT_TYPES.values())


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_event_json_round_trip(event):
    text = json.dumps(event.to_dict())
    back = T.event_from_dict(json.loads(text))
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

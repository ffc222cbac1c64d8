"""The one JSON writer (engine.events.schema.json_text): the standard library's compact text,
written by msgspec, with its two documented spellings; events and step records
written without their dicts give the same text as through them."""

import json

import pytest

from engine.events.schema.json_text import compact
from engine.events.schema.step import StepRecord
from engine.events.schema.types import ScheduledPhase
from engine.protocol.codec import encode
from engine.protocol.messages import Step
from engine.store.db import step_row

from tests.events.test_serialization import EXAMPLES


def std(obj):
    return json.dumps(obj, separators=(",", ":"))


SAME = [
    None, True, False, 0, -7, 2**63, -(2**63) - 1, 10**30, 0.1, 1 / 3, -0.0, 2.0, 1700000000.25,
    "", "plain", 'quote " back \\ slash / tab \t nl \n ctl \x01 del \x7f',
    "é ü 中 \u2028 😀",  # non-ASCII: escaped, as the standard library does
    "lone \ud800 surrogate",  # msgspec refuses it: the standard library writes it
    [1, [2, [3, {}]]], (1, 2), {"a": 1, "b": [None, {"c": "d"}]}, {1: "int key"},
    {"phase": ScheduledPhase.DECODE},  # a str enum: its value
]


@pytest.mark.parametrize("obj", SAME, ids=repr)
def test_same_text_as_the_standard_library(obj):
    text = compact(obj)
    assert text == std(obj)
    assert text.isascii()


def test_the_two_spellings_that_differ_keep_the_value():
    assert [compact(x) for x in (1e-05, 3.5e-07, 1e16, 1.5e300)] == [
        "0.00001", "3.5e-7", "1e16", "1.5e300"]  # json.dumps: 1e-05, 3.5e-07, 1e+16, 1.5e+300
    for x in (1e-05, 3.5e-07, 1e16, 1.5e300, -2.5e-300, 5e-324, 1.7976931348623157e308):
        assert json.loads(compact(x)) == x
    # not JSON in the standard library's spelling; null here, and the engine writes none
    assert [compact(x) for x in (float("nan"), float("inf"), -float("inf"))] == ["null"] * 3


def test_a_type_json_cannot_write_still_raises():
    with pytest.raises(TypeError):
        compact({"x": object()})


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_an_event_written_without_its_dict(event):
    assert event.to_json() == std(event.to_dict())


def test_an_event_with_non_ascii_text_falls_back_to_escapes():
    from engine.events.schema.types import RequestFinished

    e = RequestFinished(3, "réq", "stop")
    assert e.to_json() == std(e.to_dict())


def test_a_step_record_is_written_once_for_the_frame_and_the_row():
    rec = StepRecord(seq=7, step=9, ts=1700000000.25, events=list(EXAMPLES),
                     metrics={"kv_cache_usage": 0.5, "ttft_s": [0.1], "hit": None, "n": 3})
    frame = encode(Step(rec))
    assert frame == std(Step(rec).to_dict())
    assert rec.to_json() == std(rec.to_dict())
    events, metrics = rec.json_parts()
    assert rec.json_parts()[0] is events  # written once, then shared
    row = step_row("run", rec)
    assert row == {"run_id": "run", "seq": 7, "step": 9, "ts": 1700000000.25,
                   "events": std(rec.to_dict()["events"]), "metrics": std(rec.metrics)}
    assert row["events"] is events and row["metrics"] is metrics
    # the dict form (an import) gives the same row
    assert step_row("run", rec.to_dict()) == row


def test_a_copy_of_a_record_writes_its_own_text():
    from dataclasses import replace

    rec = StepRecord(0, 1, 2.5, [EXAMPLES[0]], {"a": 1})
    rec.json_parts()
    other = replace(rec, events=[EXAMPLES[1]])
    assert other.json_parts()[0] == std([EXAMPLES[1].to_dict()])
    assert other == replace(rec, events=[EXAMPLES[1]])  # the cached text is not compared

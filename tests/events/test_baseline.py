"""Contiguous baseline against hand-computed figures on tiny traces."""

import pytest

from engine.events.types import (
    BlockAllocated, BlockFreed, PrefixLookup, RequestArrived, RequestFinished, RequestForked,
    RequestProgress, RequestScheduled,
)
from engine.events.baseline import (
    BaselineConfig, Reservation, TraceRequest, compare, paged_steps, simulate, summarize,
    trace_from_records,
)
from engine.events.step import StepRecord

MML, PPM = Reservation.MAX_MODEL_LEN, Reservation.PROMPT_PLUS_MAX_TOKENS

TRACE = [TraceRequest("a", 0, 2, 2, 3), TraceRequest("b", 0, 1, 3, 3),
         TraceRequest("c", 1, 2, 1, 2)]


def cols(result, *names):
    return [tuple(getattr(s, n) for n in names) for s in result.steps]


def test_max_model_len_variant_runs_one_at_a_time():
    # capacity 10, every request reserves 6: two never fit together
    r = simulate(TRACE, BaselineConfig(10, 6, MML))
    assert cols(r, "step", "num_running", "num_waiting", "used_slots", "reserved_unused_slots",
                "free_slots", "largest_free_run") == [
        (0, 1, 1, 3, 3, 4, 4),  # a admitted at [0, 6) and makes its 1st token
        (1, 1, 2, 4, 2, 4, 4),  # c arrived; a done after this step
        (2, 1, 1, 2, 4, 4, 4),  # b at [0, 6)
        (3, 1, 1, 3, 3, 4, 4),
        (4, 1, 1, 4, 2, 4, 4),
        (5, 1, 0, 3, 3, 4, 4),  # c
    ]
    s = r.summary()
    assert (s["num_steps"], s["mean_concurrency"], s["max_concurrency"]) == (6, 1.0, 1)
    assert s["reserved_unused_fraction"] == pytest.approx(17 / 36)
    assert s["mean_external_fragmentation"] == 0.0 and s["num_rejected"] == 0


def test_prompt_plus_max_tokens_variant_fits_two_and_fragments():
    # reservations: a 5, b 4, c 4 in 10 slots
    r = simulate(TRACE, BaselineConfig(10, 6, PPM))
    assert cols(r, "step", "num_running", "used_slots", "reserved_slots", "free_slots",
                "largest_free_run", "external_fragmentation") == [
        (0, 2, 5, 9, 1, 1, 0.0),   # a [0,5), b [5,9)
        (1, 2, 7, 9, 1, 1, 0.0),   # c waits (needs 4)
        (2, 2, 7, 8, 2, 1, 0.5),   # c [0,4); holes [4,5) and [9,10)
    ]
    s = r.summary()
    assert (s["mean_concurrency"], s["max_concurrency"]) == (2.0, 2)
    assert s["mean_external_fragmentation"] == pytest.approx(0.5 / 3)


def test_blocked_by_fragmentation_and_stranded_slots():
    trace = [TraceRequest("a", 0, 3, 1, 1), TraceRequest("b", 0, 2, 3, 3),
             TraceRequest("d", 1, 4, 1, 1)]
    r = simulate(trace, BaselineConfig(10, 10, PPM))
    # a [0,4) leaves after step 0; d needs 5: 5 slots free but the largest run is 4
    assert cols(r, "step", "free_slots", "largest_free_run", "external_fragmentation",
                "blocked_by_fragmentation", "stranded_free_slots") == [
        (0, 1, 1, 0.0, False, 0),
        (1, 5, 4, pytest.approx(0.2), True, 5),
        (2, 5, 4, pytest.approx(0.2), True, 5),
        (3, 5, 5, 0.0, False, 0),
    ]
    s = r.summary()
    assert s["steps_blocked_by_fragmentation"] == 2 and s["mean_stranded_free_slots"] == 2.5


def test_rejection_idle_skip_and_unknown_max_tokens():
    only = [TraceRequest("x", 5, 2, 1, 2)]
    assert simulate(only, BaselineConfig(4, 8, MML)).rejected == ("x",)
    r = simulate(only, BaselineConfig(4, 8, PPM))
    assert cols(r, "step", "reserved_slots", "used_slots") == [(5, 4, 3)]
    # without max_tokens the prompt+max_tokens variant reserves max_model_len
    r = simulate([TraceRequest("y", 0, 2, 1)], BaselineConfig(16, 8, PPM))
    assert r.steps[0].reserved_slots == 8
    assert simulate([], BaselineConfig(4, 4, MML)).summary()["num_steps"] == 0
    with pytest.raises(ValueError, match="capacity"):
        BaselineConfig(0, 4, MML)


def rec(seq, step, events):
    return StepRecord(seq, step, float(step), events)


def test_trace_from_records():
    records = [
        rec(0, 1, [RequestArrived(1, "a", 3), RequestArrived(1, "b", 2, arrival_index=1),
                   RequestProgress(1, "a", 4, 3, (9,))]),
        rec(1, 2, [RequestProgress(2, "a", 5, 4, (9,)),
                   RequestForked(2, "a.1", "a", (0,), 5, 4),
                   RequestProgress(2, "b", 3, 2, (1,))]),
        rec(2, 3, [RequestProgress(3, "a.1", 7, 6, (1, 2))]),
    ]
    assert trace_from_records(records, {"a": 4}) == [
        TraceRequest("a", 1, 3, 2, 4),
        TraceRequest("b", 1, 2, 1, None),
        TraceRequest("a.1", 2, 5, 2, 2),  # inherits a's budget less the 2 tokens before the fork
    ]


def paged_records():
    def admit(step, rid, blocks, n):
        return ([RequestArrived(step, rid, n), PrefixLookup(step, rid, n, 0, n, 0, 0, 0)]
                + [BlockAllocated(step, b, rid, i) for i, b in enumerate(blocks)]
                + [RequestScheduled(step, rid, n, "prefill")])
    return [
        rec(0, 1, admit(1, "a", [0, 1], 6) + [RequestProgress(1, "a", 7, 6, (9,))]),
        rec(1, 2, admit(2, "b", [2], 3) + [RequestProgress(2, "b", 4, 3, (9,)),
                                           RequestProgress(2, "a", 8, 7, (9,))]),
        rec(2, 3, [BlockFreed(3, 1, "a", 0), BlockFreed(3, 0, "a", 0),
                   RequestFinished(3, "a", "length"), RequestProgress(3, "b", 5, 4, (9,))]),
    ]


def test_paged_steps_from_events():
    rows = paged_steps(paged_records(), num_blocks=4, block_size=4)
    assert [(s.step, s.num_running, s.used_slots, s.reserved_slots, s.reserved_unused_slots,
             s.free_slots) for s in rows] == [
        (1, 1, 6, 8, 2, 8), (2, 2, 10, 12, 2, 4), (3, 1, 4, 4, 0, 12)]
    s = summarize(rows, 16)
    assert (s["mean_concurrency"], s["max_concurrency"]) == (pytest.approx(4 / 3), 2)


def test_compare_has_all_three():
    out = compare(paged_records(), num_blocks=4, block_size=4, max_model_len=8,
                  max_tokens={"a": 2, "b": 2})
    assert set(out) == {"paged", "max_model_len", "prompt_plus_max_tokens"}
    assert out["max_model_len"]["max_concurrency"] == 2  # 8 + 8 slots in 16
    assert out["paged"]["capacity"] == 16

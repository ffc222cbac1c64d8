"""Contiguous baseline against hand-computed figures on tiny traces."""

import pytest

from engine.events.baseline.contiguous import (
    BaselineConfig, Moment, Reservation, TraceRequest, compare, paged_steps, replay, simulate,
    summarize, trace_from_records,
)
from engine.events.schema.request_status import RequestStatus
from engine.events.schema.step import StepRecord
from engine.events.schema.types import (
    BlockAllocated, BlockFreed, PrefixLookup, RequestArrived, RequestFinished, RequestForked,
    RequestPreempted, RequestProgress, RequestScheduled,
)

MML, PPM = Reservation.MAX_MODEL_LEN, Reservation.PROMPT_PLUS_MAX_TOKENS
R, P = RequestStatus.RUNNING, RequestStatus.PREEMPTED
steady = TraceRequest.steady

# a: 2 steps (finishes in step 1), b: 3 steps, c: arrives at 1 and finishes in its first step
TRACE = [steady("a", 0, 2, 2, 3), steady("b", 0, 1, 3, 3), steady("c", 1, 2, 1, 2)]


def cols(result, *names):
    return [tuple(getattr(s, n) for n in names) for s in result.steps]


def test_max_model_len_variant_runs_one_at_a_time():
    # capacity 10, every request reserves 6: two never fit together
    r = simulate(TRACE, BaselineConfig(10, 6, MML))
    assert cols(r, "step", "num_running", "num_waiting", "used_slots", "reserved_unused_slots",
                "free_slots", "largest_free_run") == [
        (0, 1, 1, 2, 4, 4, 4),    # a at [0, 6); b waits
        (1, 0, 2, 0, 0, 10, 10),  # a computes its last token and leaves; c arrived
        (2, 1, 1, 1, 5, 4, 4),    # b starts 2 steps late: every later start waits >= 2
        (3, 1, 1, 2, 4, 4, 4),    # c could start (1 + 2) but b holds the pool
        (4, 0, 1, 0, 0, 10, 10),  # b's last step
        (5, 0, 0, 0, 0, 10, 10),  # c starts 4 late and finishes in that step
    ]
    assert r.delays == {"a": 0, "b": 2, "c": 4}
    s = r.summary()
    # the same 3 request-steps of running as the paged schedule, over 6 steps instead of 3
    assert (s["num_steps"], s["mean_concurrency"], s["max_concurrency"]) == (6, 0.5, 1)
    assert s["reserved_unused_fraction"] == pytest.approx(13 / 18)
    assert s["mean_external_fragmentation"] == 0.0 and s["num_rejected"] == 0
    assert s["max_delay"] == 4


def test_prompt_plus_max_tokens_variant_fits_two_and_fragments():
    # reservations: a 5, b 4, c 4 in 10 slots
    r = simulate(TRACE, BaselineConfig(10, 6, PPM))
    assert cols(r, "step", "num_running", "num_waiting", "used_slots", "reserved_slots",
                "free_slots", "largest_free_run", "external_fragmentation") == [
        (0, 2, 0, 3, 9, 1, 1, 0.0),                     # a [0,5), b [5,9)
        (1, 1, 1, 2, 4, 6, 5, pytest.approx(1 / 6)),    # c waits: a's [0,5) is held this step
        (2, 0, 0, 0, 0, 10, 10, 0.0),                   # c at [0,4), 1 late; b and c finish
    ]
    assert r.delays == {"a": 0, "b": 0, "c": 1}
    s = r.summary()
    assert (s["mean_concurrency"], s["max_concurrency"]) == (1.0, 2)
    assert s["mean_external_fragmentation"] == pytest.approx(1 / 18)


def test_blocked_by_fragmentation_and_stranded_slots():
    trace = [steady("a", 0, 3, 1, 1), steady("b", 0, 2, 3, 3), steady("d", 1, 4, 1, 1)]
    r = simulate(trace, BaselineConfig(10, 10, PPM))
    # a [0,4) leaves after step 0; d needs 5: 5 slots free but the largest run is 4
    assert cols(r, "step", "free_slots", "largest_free_run", "external_fragmentation",
                "blocked_by_fragmentation", "stranded_free_slots") == [
        (0, 5, 4, pytest.approx(0.2), False, 0),  # d has not been started by the paged run yet
        (1, 5, 4, pytest.approx(0.2), True, 5),
        (2, 10, 10, 0.0, False, 0),  # b's last step: its region is still held for admission
        (3, 10, 10, 0.0, False, 0),  # d starts (2 late) and finishes
    ]
    s = r.summary()
    assert s["steps_blocked_by_fragmentation"] == 1 and s["mean_stranded_free_slots"] == 1.25


def test_rejection_and_unknown_max_tokens():
    only = [steady("x", 5, 2, 2, 2)]
    assert simulate(only, BaselineConfig(4, 8, MML)).rejected == ("x",)
    r = simulate(only, BaselineConfig(4, 8, PPM))
    assert cols(r, "step", "reserved_slots", "used_slots", "num_running") == [
        (5, 4, 2, 1), (6, 0, 0, 0)]
    # without max_tokens the prompt+max_tokens variant reserves max_model_len
    r = simulate([steady("y", 0, 2, 2)], BaselineConfig(16, 8, PPM))
    assert r.steps[0].reserved_slots == 8
    assert simulate([], BaselineConfig(4, 4, MML)).summary()["num_steps"] == 0
    with pytest.raises(ValueError, match="capacity"):
        BaselineConfig(0, 4, MML)
    with pytest.raises(ValueError, match="moments"):
        TraceRequest("z", 0, 2, 0, (Moment(R, 2),), finish_step=3)


def test_a_late_start_shifts_the_whole_schedule_preemptions_included():
    # The paged run: a runs 0-1, is preempted at 2-3, resumes 4-5; b runs 0-2 and finishes in 3.
    a = TraceRequest("a", 0, 4, 0, (Moment(R, 4), Moment(R, 5), Moment(P, 0), Moment(P, 0),
                                    Moment(R, 6), Moment(R, 7)), 6, 4, 8)
    b = TraceRequest("b", 0, 4, 0, (Moment(R, 4), Moment(R, 5), Moment(R, 6)), 3, 4, 8)
    paged = [2, 2, 1, 0, 1, 1, 0]  # running at the end of steps 0..6 (a's last)
    roomy = simulate([a, b], BaselineConfig(16, 8, PPM))
    assert [s.num_running for s in roomy.steps] == paged  # no delay: the same, step by step
    assert [s.num_waiting for s in roomy.steps] == [0, 0, 1, 1, 0, 0, 0]  # a preempted
    tight = simulate([a, b], BaselineConfig(8, 8, PPM))  # one region at a time
    assert tight.delays == {"a": 0, "b": 7}  # b starts once a's region is free
    assert [s.num_running for s in tight.steps] == [1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 0]
    assert [s.num_waiting for s in tight.steps] == [1, 1, 2, 2, 1, 1, 1, 0, 0, 0, 0]
    # same request-steps of running (7), more steps: mean concurrency cannot exceed paged
    assert sum(s.num_running for s in tight.steps) == sum(paged) == 7
    assert tight.summary()["mean_concurrency"] < sum(paged) / len(paged)


def rec(seq, step, events):
    return StepRecord(seq, step, float(step), events)


def test_trace_from_records():
    sched = RequestScheduled
    records = [
        rec(0, 1, [RequestArrived(1, "a", 3), RequestArrived(1, "b", 2, arrival_index=1),
                   sched(1, "a", 3, "prefill"), RequestProgress(1, "a", 4, 3, (9,))]),
        rec(1, 2, [sched(2, "a", 1, "decode", 3), sched(2, "b", 2, "prefill"),
                   RequestProgress(2, "a", 5, 4, (9,)),
                   RequestForked(2, "a.1", "a", (0,), 5, 4),
                   RequestProgress(2, "b", 3, 2, (1,))]),
        rec(2, 3, [RequestProgress(3, "a.1", 7, 6, (1, 2)), RequestPreempted(3, "b")]),
        # step 4 was lost (a live client's gap): every state holds still through it
        rec(3, 5, [RequestFinished(5, "a", "stop")]),
    ]
    run4 = [Moment(R, 4)] * 3
    assert trace_from_records(records, {"a": 4}) == [
        TraceRequest("a", 1, 3, 1, (Moment(R, 3),) + tuple(run4), 5, 4, 5),
        TraceRequest("b", 1, 2, 2, (Moment(R, 2),) + (Moment(P, 0),) * 3, None, None, 3),
        # a.1 inherits a's budget less the 2 tokens before the fork
        TraceRequest("a.1", 2, 5, 2, (Moment(R, 4),) + (Moment(R, 6),) * 3, None, 2, 7, "a"),
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


def test_replay_equals_paged_step_by_step_when_everything_fits():
    recs = paged_records()
    paged = paged_steps(recs, num_blocks=4, block_size=4)
    r = replay(recs, BaselineConfig(16, 8, PPM), {"a": 2, "b": 2})
    assert r.delays == {"a": 0, "b": 0}
    assert [(s.step, s.num_running, s.num_waiting) for s in r.steps] == [
        (s.step, s.num_running, s.num_waiting) for s in paged]
    # b is still running after the last recorded step: the replay stops there
    assert r.steps[-1].step == 3 and r.steps[-1].used_slots == 4

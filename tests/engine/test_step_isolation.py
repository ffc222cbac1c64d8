"""A forward that raises fails only the request that makes it raise (issue 17: "If a step
raises anyway, fail only the requests in that step, not the engine"; engine.engine_core.step_isolation).

Before this (main at b923685) the engine raised, and the server failed every request of
the step: ``good`` below ended with ``abort``. The fault is injected into the runner: a
piece of work holding the token POISON raises, as a request whose parameters or data
break the forward would."""

from __future__ import annotations

from engine import SamplingParams
from engine.config import EngineConfig
from engine.events.folds.pool_state import PoolState
from engine.llm_engine import build_engine
from engine.core.core_step import RequestFailure

POISON = 250
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
GOOD = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # 9 tokens: two full blocks of 4
BAD = [5, 6, POISON, 8, 9, 10, 11, 12, 13]


def _engine(tiny_llama, **kw):
    cfg = dict(model=tiny_llama, block_size=4, num_kv_blocks=32, max_model_len=64)
    return build_engine(EngineConfig(**{**cfg, **kw}))


def _poison(eng, when=lambda out: any(POISON in s.token_ids for s in out.scheduled)):
    """Make ``eng``'s forward raise when ``when(scheduler_output)``; returns the refused
    batches (their request ids)."""
    execute, refused = eng.engine_core.runner.execute, []

    def faulty(out):
        if when(out):
            refused.append([s.request_id for s in out.scheduled])
            raise RuntimeError("injected fault")
        return execute(out)

    eng.engine_core.runner.execute = faulty
    return refused


def _run(eng) -> dict:
    """Step until idle; the final output of each request."""
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    return done


def _alone(tiny_llama, prompt, params) -> list[int]:
    ref = _engine(tiny_llama)
    ref.add_request(prompt, params, request_id="ref")
    return list(_run(ref)["ref"].outputs[0].token_ids)


def test_only_the_culprit_fails_and_the_kv_state_stays_exact(tiny_llama):
    eng = _engine(tiny_llama)
    records = []
    eng.step_listeners.append(records.append)
    start = PoolState.from_snapshot(eng.snapshot())
    refused = _poison(eng)
    eng.add_request(GOOD, GREEDY, request_id="good")
    eng.add_request(BAD, GREEDY, request_id="bad")
    eng.add_request([20, 21, 22], SEEDED, request_id="seeded")  # new in the failed step
    kv, pool = eng.engine_core.scheduler.kv, eng.engine_core.scheduler.kv.pool

    first = eng.step()
    assert refused == [["good", "bad", "seeded"], ["bad"]]  # the batch, then bad alone
    assert eng.last_fault.failures == [RequestFailure("bad", "RuntimeError: injected fault")]
    assert eng.last_fault.detail == "RuntimeError: injected fault"
    assert [(o.request_id, o.finished) for o in first] == [("bad", True), ("good", False),
                                                         ("seeded", False)]
    assert first[0].outputs[0].finish_reason == "abort" and first[0].outputs[0].token_ids == []
    # blocks: good has 0-2, bad had 3-5 (freed, no hash: never hittable), seeded has 6
    assert kv.block_ids("good") == [0, 1, 2] and kv.block_ids("seeded") == [6]
    assert "bad" not in kv.tables and "bad" not in eng.engine_core.scheduler.requests
    assert [pool.blocks[i].ref_count for i in range(7)] == [1, 1, 1, 0, 0, 0, 1]
    assert all(b.hash is None for b in pool.blocks) and pool.cached == {}  # the step's hashes rolled back
    assert eng.snapshot().free_queue[:3] == (3, 4, 5)  # bad's, reused first (tail freed first)
    assert eng.engine_core.scheduler.requests["good"].num_computed_tokens == 9
    assert eng.engine_core.scheduler.requests["seeded"].num_computed_tokens == 3

    # a request with good's prompt misses: the rolled-back hashes are not hits
    eng.add_request(GOOD, GREEDY, request_id="twin")
    done = _run(eng)
    assert done["twin"].num_cached_tokens == 0
    alone = _alone(tiny_llama, GOOD, GREEDY)
    assert list(done["good"].outputs[0].token_ids) == alone == list(done["twin"].outputs[0].token_ids)
    assert list(done["seeded"].outputs[0].token_ids) == _alone(tiny_llama, [20, 21, 22], SEEDED)
    assert len(refused) == 2 and eng.last_fault is None  # no later step failed
    # the events rebuild the engine's true state; everything is released
    for r in records:
        start.apply_step(r)
    snap = eng.snapshot()
    assert start.to_snapshot() == snap
    assert all(b.ref_count == 0 for b in snap.blocks) and not snap.requests


def test_a_request_reading_a_failed_writers_blocks_fails_with_it(tiny_llama):
    # reader is admitted after writer in the same step and hits the two blocks writer
    # hashed at schedule: their K/V is what writer's failed forward was to write.
    eng = _engine(tiny_llama)
    writer = [POISON, 1, 2, 3, 4, 5, 6, 7, 8]
    refused = _poison(eng)
    eng.add_request([30, 31, 32, 33, 34], GREEDY, request_id="bystander")
    eng.add_request(writer, GREEDY, request_id="writer")
    eng.add_request(writer[:8] + [9, 10], GREEDY, request_id="reader")
    out = eng.step()
    reader = eng.last_fault.failures[1]
    assert [f.request_id for f in eng.last_fault.failures] == ["writer", "reader"]
    assert "read K/V a failed request" in reader.detail
    # the reader's own piece never ran: its new tokens hold no poison, yet it failed
    assert refused == [["bystander", "writer", "reader"], ["writer"]]
    assert [o.request_id for o in out if o.finished] == ["writer", "reader"]
    pool = eng.engine_core.scheduler.kv.pool
    assert list(eng.engine_core.scheduler.requests) == ["bystander"] and pool.cached == {}
    assert sum(b.ref_count for b in pool.blocks) == len(eng.engine_core.scheduler.kv.block_ids("bystander")) == 2
    done = _run(eng)
    assert list(done["bystander"].outputs[0].token_ids) == _alone(tiny_llama, [30, 31, 32, 33, 34], GREEDY)


def test_a_batch_that_fails_only_as_a_batch_fails_nobody(tiny_llama):
    # e.g. memory for the batch: each request alone runs, so every one goes on
    eng = _engine(tiny_llama)
    refused = _poison(eng, when=lambda out: len(out.scheduled) > 1 and out.scheduled[0].start_position == 0)
    eng.add_request(GOOD, GREEDY, request_id="a")
    eng.add_request([40, 41, 42, 43, 44, 45], GREEDY, request_id="b")
    out = eng.step()
    assert refused == [["a", "b"]] and eng.last_fault.failures == []
    assert [o.finished for o in out] == [False, False]
    done = _run(eng)
    assert list(done["a"].outputs[0].token_ids) == _alone(tiny_llama, GOOD, GREEDY)
    assert list(done["b"].outputs[0].token_ids) == _alone(tiny_llama, [40, 41, 42, 43, 44, 45], GREEDY)


def test_a_forked_request_fails_whole_and_its_siblings_run(tiny_llama):
    # n=2 forks at its first sample; the failing piece is a later decode of one sample
    eng = _engine(tiny_llama)
    params = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=6, ignore_eos=True)
    eng.add_request([50, 51, 52], params, request_id="fork")
    eng.add_request([60, 61, 62], GREEDY, request_id="other")
    eng.step()  # prefill + fork
    child = "fork#1"
    assert child in eng.engine_core.scheduler.requests
    refused = _poison(eng, when=lambda out: any(s.request_id == child for s in out.scheduled))
    out = eng.step()
    assert refused == [["fork", child, "other"], [child]]  # the parent's piece ran, the child's raised
    assert eng.last_fault.failures == [RequestFailure("fork", "RuntimeError: injected fault")]
    (final,) = [o for o in out if o.finished]
    assert final.request_id == "fork" and [c.finish_reason for c in final.outputs] == ["abort", "abort"]
    assert set(eng.engine_core.scheduler.requests) == {"other"}
    assert list(_run(eng)["other"].outputs[0].token_ids) == _alone(tiny_llama, [60, 61, 62], GREEDY)


def test_split_step_gives_each_piece_its_own_share():
    from engine.core.scheduler_output import NewRequestData, ScheduledRequest, SchedulerOutput
    from engine.events.schema.types import ScheduledPhase
    from engine.engine_core.step_isolation import split_step

    p = SamplingParams()
    a = ScheduledRequest("a", [1, 2, 3, 4, 5], 0, [7, 8], [28, 29, 30, 31, 32], ("a",), ScheduledPhase.PREFILL)
    b = ScheduledRequest("b", [9], 6, [7, 3], [14], ("b", "b#1"), ScheduledPhase.DECODE)
    out = SchedulerOutput(5, [a, b], [(4, 3), (11, 12)], ["gone"], 64,
                          [NewRequestData("a", p, 1), NewRequestData("b#1", p, 2)], ["done"], 1.5)
    pa, pb = split_step(out, 4)
    assert (pa.request_id, pb.request_id) == ("a", "b")
    assert pa.output.scheduled == [a] and pb.output.scheduled == [b]
    # b's table holds block 3, the copy's destination; (11, 12) lands in no table: a's, the first
    assert pb.output.cow_pairs == [(4, 3)] and pa.output.cow_pairs == [(11, 12)]
    assert [n.request_id for n in pa.output.new_requests] == ["a"]
    assert [n.request_id for n in pb.output.new_requests] == ["b#1"]  # the fork child sampled by b
    assert pa.output.finished_request_ids == pb.output.finished_request_ids == ["done"]
    assert pa.output.preempted == [] and pa.output.step == 5 and pa.output.timestamp == 1.5
    assert (pa.reads, pa.writes) == ({7, 8}, {7, 8})  # slots 28..32 are blocks 7 and 8
    assert (pb.reads, pb.writes) == ({7, 3}, {3})  # b attends over block 7, writes only 3

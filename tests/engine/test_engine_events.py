"""The real engine's step records rebuild its true state, step by step."""

import random

from engine import LLM, SamplingParams
from engine.events.folds.reducer import PoolState
from engine.events.schema.step import StepRecord


def test_step_records_rebuild_engine_state_on_a_mixed_workload(tiny_llama):
    llm = LLM(model=tiny_llama, block_size=4, num_kv_blocks=24, max_model_len=64,
              max_num_batched_tokens=16, max_num_seqs=6)
    eng = llm.engine
    state = PoolState(24, 4)
    kinds = set()
    checked = 0

    def fold(record):
        nonlocal checked
        record = StepRecord.from_json(record.to_json())
        kinds.update(e.type for e in record.events)
        state.apply_step(record)
        got, snap = state.to_snapshot(), eng.snapshot()
        assert got == snap, f"drift at step {record.step}"
        checked += 1

    eng.step_listeners.append(fold)
    rng = random.Random(0)
    system = list(range(100, 113))  # 13 shared tokens: 3 full blocks of 4
    for i in range(10):
        prompt = system + [rng.randrange(3, 250) for _ in range(rng.randrange(1, 12))]
        n = 3 if i % 4 == 1 else 1
        eng.add_request(prompt, SamplingParams(temperature=0.8, n=n, max_tokens=rng.randrange(4, 14), seed=i))
        if i % 2:
            eng.step()
    while eng.has_unfinished_requests():
        eng.step()
    assert checked > 10
    assert {"prefix_hit", "cow_copy", "request_forked", "block_evicted", "request_preempted"} <= kinds


COUNTED = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_resumed_queries",
           "prefix_cache_resumed_hits", "num_preemptions", "num_evictions", "cow_copies")


def _pressure(eng, monkeypatch):
    """Shared prompts on a small pool (hits, LRU evictions, preemptions, forks), one prefix
    reset and one failed forward (its hashes are withdrawn)."""
    rng = random.Random(1)
    system = list(range(100, 113))
    for i in range(8):
        prompt = system + [rng.randrange(3, 250) for _ in range(rng.randrange(1, 10))]
        eng.add_request(prompt, SamplingParams(temperature=0.8, seed=i, n=3 if i in (3, 6) else 1,
                                               max_tokens=rng.randrange(6, 16)))
        eng.step()
        if i == 4:
            eng.reset_prefix_cache()
    while eng.has_unfinished_requests():
        eng.step()
    eng.add_request(list(range(200, 218)), SamplingParams(temperature=0, max_tokens=2),
                    request_id="doomed")

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    with monkeypatch.context() as m:
        m.setattr(eng.engine_core.runner, "execute", broken)
        (failed,) = eng.step()  # alone in its step: failed by the engine (engine.engine_core.step_isolation)
    assert failed.request_id == "doomed" and failed.outputs[0].finish_reason == "abort"
    eng.add_request(system + [7, 8], SamplingParams(temperature=0, max_tokens=3))
    while eng.has_unfinished_requests():
        eng.step()


def test_stats_and_step_metrics_count_from_one_tracker(tiny_llama, monkeypatch):
    llm = LLM(model=tiny_llama, block_size=4, num_kv_blocks=16, max_model_len=48,
              max_num_batched_tokens=16, max_num_seqs=4)
    eng = llm.engine
    _pressure(eng, monkeypatch)
    stats, m = llm.stats(), eng.last_metrics
    assert {k: stats[k] for k in COUNTED} == {k: m[k] for k in COUNTED}
    # every kind of hash drop happened, and only LRU reuse counts as an eviction
    assert m["num_evictions"] > 0 and m["num_preemptions"] > 0 and m["cow_copies"] > 0
    assert m["num_reset_evictions"] > 0 and m["num_rollback_evictions"] > 0
    assert m["prefix_cache_resumed_queries"] > 0
    # the same counts with events off: the tracker sees every event either way
    quiet = LLM(model=tiny_llama, block_size=4, num_kv_blocks=16, max_model_len=48,
                max_num_batched_tokens=16, max_num_seqs=4, enable_events=False)
    _pressure(quiet.engine, monkeypatch)
    assert {k: quiet.stats()[k] for k in COUNTED} == {k: stats[k] for k in COUNTED}

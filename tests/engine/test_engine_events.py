"""The real engine's step records rebuild its true state, step by step."""

import random

from engine import LLM, SamplingParams
from engine.events.reducer import PoolState
from engine.events.step import StepRecord


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

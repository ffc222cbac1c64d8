"""A real engine (the tiny Llama) publishing its KV cache: the stream is the pool, step by step."""

import random
import uuid

import pytest

from engine import LLM, SamplingParams
from engine.core import ConfigError
from tests.kv_events.subscriber import Subscriber
from tests.kv_events.test_mapping import vllm_int
from tests.kv_events.test_publisher import free_port

MEDIUM = "GPU"  # vLLM's name for the engine's own pool, on any device (vLLM 0.32 on CPU sends it)
ENGINE = dict(block_size=4, num_kv_blocks=24, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=6)


def truth(eng) -> dict[int, tuple[int, ...]]:
    return {vllm_int(h): b.token_ids for h, b in eng.engine_core.scheduler.kv.pool.cached.items()}


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    system = list(range(100, 113))  # 13 shared tokens: 3 full blocks of 4
    out = []
    for i in range(12):
        prompt = (system if i % 3 else []) + [rng.randrange(3, 250) for _ in range(rng.randrange(1, 12))]
        out.append((prompt, SamplingParams(temperature=0, max_tokens=rng.randrange(3, 12), ignore_eos=True)))
    return out


def run(llm, items, each_step=None) -> list[list[int]]:
    eng = llm.engine
    ids = [eng.add_request(p, sp) for p, sp in items]
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        if each_step is not None:
            each_step()
    return [done[i] for i in ids]


def test_stream_equals_the_engine_cache_after_every_step(tiny_llama):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(replay=replay)
    llm = LLM(model=tiny_llama, **ENGINE, kv_events_config={
        "enable_kv_cache_events": True, "endpoint": sub.endpoint, "replay_endpoint": replay})
    eng, pub = llm.engine, llm.engine.kv_events
    checked = []

    def check():
        assert pub.flush()
        if pub.seq:
            sub.wait_for(pub.seq - 1)
        assert {h: sub.tokens[h] for h in sub.hashes} == truth(eng), f"step {eng.engine_core.scheduler.step}"
        checked.append(eng.engine_core.scheduler.step)

    try:
        outputs = run(llm, workload(0), check)
        kinds = {k for _, k in sub.log}
        assert {"BlockStored", "BlockRemoved"} <= kinds
        media = {e.medium for b in sub.batches.values() for e in b.events if hasattr(e, "medium")}
        assert media == {MEDIUM}
        n = llm.reset_prefix_cache()
        assert n > 0
        run(llm, workload(1)[:1], check)  # the reset goes out with the next step
        (reset_seq,) = [seq for seq, k in sub.log if k == "AllBlocksCleared"]
        reset_batch = [k for seq, k in sub.log if seq == reset_seq]
        assert reset_batch[0] == "AllBlocksCleared" and "BlockRemoved" not in reset_batch
        assert len(checked) > 20
    finally:
        llm.close()
        sub.close()
    assert not pub._thread.is_alive()
    with LLM(model=tiny_llama, **ENGINE) as plain:  # serving is not changed by publishing
        assert run(plain, workload(0)) == outputs


def test_a_failed_forward_is_stored_then_removed(tiny_llama):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(replay=replay)
    with LLM(model=tiny_llama, **ENGINE, kv_events_config={
            "enable_kv_cache_events": True, "endpoint": sub.endpoint, "replay_endpoint": replay}) as llm:
        eng = llm.engine
        real = eng.engine_core.runner.execute

        def broken(*a, **kw):
            raise RuntimeError("device lost")

        eng.engine_core.runner.execute = broken
        eng.add_request(list(range(10, 30)), SamplingParams(temperature=0, max_tokens=2))
        (failed,) = eng.step()  # alone in its step: failed there (engine.engine_core.step_isolation), and published
        assert (failed.request_id, failed.outputs[0].finish_reason) == ("req-0", "abort")
        eng.engine_core.runner.execute = real
        assert not eng.has_unfinished_requests()
        assert eng.kv_events.flush()
        sub.wait_for(eng.kv_events.seq - 1)
        kinds = [k for _, k in sub.log]
        assert kinds[0] == "BlockStored" and kinds.count("BlockRemoved") == len(sub.batches[0].events[0].block_hashes)
        assert sub.hashes == set() == set(truth(eng))
    sub.close()


def test_silent_and_late_subscribers_do_not_disturb_serving(tiny_llama):
    endpoint = f"inproc://kv-{uuid.uuid4().hex}"
    replay = f"tcp://127.0.0.1:{free_port()}"
    items = workload(2)
    with LLM(model=tiny_llama, **ENGINE) as plain:
        expected = run(plain, items)
    with LLM(model=tiny_llama, **ENGINE, kv_events_config={
            "enable_kv_cache_events": True, "endpoint": endpoint, "replay_endpoint": replay,
            "hwm": 4}) as llm:
        sleeper = Subscriber(endpoint=endpoint, bind=False, rcvhwm=4)  # connects, never reads
        got = run(llm, items[:6])
        late = Subscriber(endpoint=endpoint, bind=False, replay=replay)  # joins half way
        got += run(llm, items[6:])
        pub = llm.engine.kv_events
        assert pub.flush()
        late.wait_for(pub.seq - 1)
        assert late.hashes == set(truth(llm.engine))
        assert 0 in late.replayed
        assert pub.stats()["dropped_steps"] == 0 and pub.stats()["queued"] == 0
        assert sleeper.pump(0.2) <= 4 + 4  # what ZMQ holds for it is bounded by the marks
        sleeper.close()
        late.close()
    assert got == expected


def test_llm_config_errors(tiny_llama):
    with pytest.raises(ConfigError, match="unknown field"):
        LLM(model=tiny_llama, **ENGINE, kv_events_config={"enable_kv_cache_events": True, "port": 1})
    with pytest.raises(ConfigError, match="need prefix caching"):
        LLM(model=tiny_llama, **ENGINE, enable_prefix_caching=False,
            kv_events_config='{"enable_kv_cache_events": true}')
    with LLM(model=tiny_llama, **ENGINE, kv_events_config={"enable_kv_cache_events": False}) as llm:
        assert llm.engine.kv_events is None  # disabled: no publisher, no listener

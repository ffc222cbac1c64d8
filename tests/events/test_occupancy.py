"""Token against block occupancy (issue 31 item 6): exact on a constructed workload of the
real engine, equal to a fold of its events, exported in /metrics, and the bound an attached
viewer's stored blocks allow."""

import pytest

from engine.events.folds.reducer import PoolState
from engine.events.metrics.occupancy import TokenUsageBound

BS, POOL = 16, 16
PROMPTS = (17, 33, 40)  # 2 + 3 + 3 = 8 blocks; 1 + 2 + 2 = 5 of them full after the prefill


def test_bound_hand_checked():
    # 16 blocks, 8 referenced, 5 stored: up to 8 free blocks could hold all 5 hashes
    assert TokenUsageBound.of(16, 8, 5) == TokenUsageBound(0.0, 0.5)
    # 12 stored with only 8 free: at least 4 referenced blocks are full
    b = TokenUsageBound.of(16, 8, 12)
    assert b == TokenUsageBound(4 / 16, 8 / 16) and b.holds(0.25) and b.holds(0.5)
    assert not b.holds(0.24) and not b.holds(0.51)
    # vLLM #57336's shape: a full pool, every request's first block full and stored
    assert TokenUsageBound.of(32, 32, 16) == TokenUsageBound(0.5, 1.0)
    assert TokenUsageBound.of(4, 0, 0) == TokenUsageBound(0.0, 0.0)
    # a vLLM pod of 17 blocks (16 usable: the null block) at 50% usage holding 10 stored copies
    assert TokenUsageBound.of_vllm(17, 0.5, 10) == TokenUsageBound(2 / 16, 8 / 16)


@pytest.mark.parametrize("args, msg", [
    ((0, 0, 0), "at least 1"), ((4, 5, 0), "do not fit"), ((4, 1, 5), "do not fit"),
    ((4, -1, 0), "num_used_blocks must be a non-negative integer"),
    ((4, 1.0, 0), "num_used_blocks must be a non-negative integer"),
    ((4, 1, True), "num_stored_blocks must be a non-negative integer"),
])
def test_bound_refuses_bad_input(args, msg):
    with pytest.raises(ValueError, match=msg):
        TokenUsageBound.of(*args)


@pytest.fixture(scope="module")
def run():
    """Three requests of known lengths on a 16-block pool of 16 slots; each step's record."""
    import torch

    from engine import LLM, SamplingParams
    from tests.tiny_models import tiny_model_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(model=str(tiny_model_dir("llama")), block_size=BS, num_kv_blocks=POOL,
                  max_model_len=64, max_num_batched_tokens=128)
        eng = llm.engine
        records = []
        eng.step_listeners.append(records.append)
        for i, n in enumerate(PROMPTS):
            eng.add_request([10 + i] + list(range(100, 100 + n - 1)),
                            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        while eng.has_unfinished_requests():
            eng.step()
        return eng.describe(), records
    finally:
        torch.set_num_threads(threads)


def test_engine_figures_are_exact_and_equal_the_fold_of_the_events(run):
    config, records = run
    assert (config["block_size"], config["num_blocks"]) == (BS, POOL)
    state = PoolState(POOL, BS)
    for r in records:
        state.apply_step(r)
        folded = state.summary().figures()
        for k in ("kv_cache_usage", "kv_token_usage", "num_filled_slots", "num_used_blocks"):
            assert r.metrics[k] == folded[k], (r.step, k)
        stored = sum(h is not None for h in state.hash)
        assert TokenUsageBound.of(POOL, folded["num_used_blocks"], stored).holds(r.metrics["kv_token_usage"])
    # steps 1..3: all three prefilled at step 1, then one more token computed per step
    for k, r in enumerate(records[:3]):
        tokens = sum(PROMPTS) + 3 * k
        assert r.metrics["num_filled_slots"] == tokens
        assert r.metrics["kv_token_usage"] == tokens / (POOL * BS)
        assert r.metrics["kv_cache_usage"] == 8 / POOL
        assert r.metrics["internal_fragmentation"] == 1 - tokens / (8 * BS)
    assert len(records) == 4 and records[-1].metrics["num_used_blocks"] == 0  # all finished


def test_metrics_endpoint_exports_token_beside_block_usage(run):
    """The server's registry, fed the engine's own step records, as /metrics renders it."""
    from engine.server.metrics.prom import ServerMetrics
    from tests.server.prom_samples import Samples

    config, records = run
    reg = ServerMetrics("tiny")
    reg.watch_config(lambda: config)
    reg.observe_step(records[0])
    s = Samples(reg.render().decode())
    assert s.get("vllm:kv_cache_usage_perc") == 0.5
    assert s.get("kvscope_kv_token_usage") == 90 / 256
    assert s.get("kvscope_kv_filled_token_slots") == 90
    assert s.types["kvscope_kv_filled_token_slots"] == "gauge"

"""The vLLM-shaped API on a tiny model: forks, seeds, stops, errors, stats."""

import logging

import pytest

from engine import LLM, SamplingParams
from engine.core import EmptyPromptError, KVCacheTooSmallError, PromptTooLongError, child_request_id

PROMPT = list(range(40, 58))  # 18 tokens: block 4 leaves a partial last block


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=tiny_llama, block_size=4, num_kv_blocks=128, max_model_len=96)


def _peak_blocks(llm, prompts, params):
    peak = 0
    eng = llm.engine

    def watch(record):
        nonlocal peak
        peak = max(peak, record.metrics["num_used_blocks"])

    eng.step_listeners.append(watch)
    try:
        outs = llm.generate(prompts, params)
    finally:
        eng.step_listeners.remove(watch)
    return outs, peak


def test_n3_forks_share_blocks_copy_on_write_and_use_fewer_blocks(tiny_llama):
    llm = LLM(model=tiny_llama, block_size=4, num_kv_blocks=128, max_model_len=96,
              enable_prefix_caching=False)
    params = SamplingParams(temperature=1.0, n=3, max_tokens=8, seed=7)
    before = llm.stats()["cow_copies"]
    (out,), forked_peak = _peak_blocks(llm, [PROMPT], params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # samples differ
    # 3 samples share a partial last block: the first two writers copy it
    assert llm.stats()["cow_copies"] - before == 2
    single = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    _, separate_peak = _peak_blocks(llm, [PROMPT] * 3, single)
    assert forked_peak < separate_peak
    # seen at step ends: before the last step each sample has computed 24 tokens = 6 blocks,
    # the first 4 shared by all three, blocks 4 (copied) and 5 their own
    assert forked_peak == 4 + 3 * 2
    assert separate_peak == 3 * 6


def test_fork_tables_share_every_block_right_after_the_fork(llm):
    eng = llm.engine
    rid = eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=4, seed=1))
    eng.step()  # prefill + fork
    snap = eng.snapshot()
    tables = [snap.requests[r].block_table for r in (rid, child_request_id(rid, 1), child_request_id(rid, 2))]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 5
    assert [snap.blocks[b].ref_count for b in tables[0]] == [3] * 5
    while eng.has_unfinished_requests():
        eng.step()


def test_seed_reproduces_and_differs(llm):
    a = llm.generate([PROMPT], SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=10, seed=3))
    b = llm.generate([PROMPT], SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=10, seed=3))
    c = llm.generate([PROMPT], SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_tokens=10, seed=4))
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids
    assert a[0].outputs[0].token_ids != c[0].outputs[0].token_ids


def test_stop_string_and_stop_token(llm):
    greedy = llm.generate(["the cat sat on the mat"], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    text = greedy.text
    stop = text[4:6]
    assert stop and text.find(stop) >= 4
    out = llm.generate(["the cat sat on the mat"],
                       SamplingParams(temperature=0, max_tokens=12, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.find(stop)]
    tok = greedy.token_ids[2]
    out = llm.generate(["the cat sat on the mat"],
                       SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[tok]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids == greedy.token_ids[: greedy.token_ids.index(tok) + 1]


def test_logprobs_and_metrics(llm):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=3, logprobs=2))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == 3
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert tok in entry and max(entry.values()) == entry[tok]
    m = out.metrics
    assert m.arrival_time <= m.first_token_time <= m.finished_time
    assert out.prompt_token_ids == PROMPT


def test_chat_uses_the_template(llm):
    tok = llm.get_tokenizer()
    msgs = [{"role": "user", "content": "hi there"}]
    out = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=2))[0]
    expected = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out.prompt == expected and expected.endswith("<|im_start|>assistant\n")


def test_bad_input_is_a_clear_error_and_the_engine_keeps_serving(llm):
    with pytest.raises(PromptTooLongError, match="max_model_len is 96"):
        llm.generate([list(range(100))], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(EmptyPromptError, match="the prompt is empty"):  # its own error, not "too long"
        llm.engine.add_request([], SamplingParams(max_tokens=2))
    assert not isinstance(EmptyPromptError("x"), PromptTooLongError)
    assert not llm.engine.has_unfinished_requests()
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2


def test_kv_budget_too_small_says_what_to_change(tiny_llama):
    with pytest.raises(KVCacheTooSmallError, match="raise num_kv_blocks / kv_cache_memory"):
        LLM(model=tiny_llama, block_size=16, num_kv_blocks=4, max_model_len=128)
    with pytest.raises(KVCacheTooSmallError, match="kv_cache_memory"):
        LLM(model=tiny_llama, block_size=16, kv_cache_memory=1000, max_model_len=128)


def test_float16_on_cpu_falls_back_with_warning(tiny_llama, caplog):
    with caplog.at_level(logging.WARNING):
        llm = LLM(model=tiny_llama, dtype="float16", num_kv_blocks=64, max_model_len=64)
    assert "float32" in str(llm.engine.engine_core.loaded.dtype)
    assert any("float32" in r.getMessage() for r in caplog.records)


def test_stats_keys(llm):
    s = llm.stats()
    for key in ("num_blocks", "block_size", "kv_cache_usage", "kv_token_usage", "prefix_cache_queries",
                "prefix_cache_hits", "num_preemptions", "num_evictions", "cow_copies"):
        assert key in s


def test_a_failed_forward_leaves_no_hash_on_blocks_it_never_wrote(tiny_llama, monkeypatch):
    """Blocks are hashed when scheduled; if that step's forward raises, their K/V was
    never written, so no later request may hit them."""
    llm = LLM(model=tiny_llama, block_size=4, num_kv_blocks=64, max_model_len=96)
    eng = llm.engine
    eng.add_request(list(PROMPT), SamplingParams(temperature=0, max_tokens=2), request_id="doomed")

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(eng.engine_core.runner, "execute", broken)
    (failed,) = eng.step()  # alone in its step: the engine fails it (engine.engine_core.step_isolation)
    assert (failed.request_id, failed.finished, failed.outputs[0].finish_reason) == ("doomed", True, "abort")
    assert [(f.request_id, f.detail) for f in eng.last_fault.failures] == [("doomed", "RuntimeError: device lost")]
    assert not eng.engine_core.scheduler.kv.pool.cached  # the 4 full prompt blocks lost their hashes
    assert not eng.has_unfinished_requests()
    monkeypatch.undo()
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))
    assert out[0].num_cached_tokens == 0  # recomputed, not read from unwritten blocks
    again = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))
    assert again[0].num_cached_tokens == 16 and again[0].outputs[0].token_ids == out[0].outputs[0].token_ids

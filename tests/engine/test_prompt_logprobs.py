"""Prompt logprobs, allowed_token_ids and logit_bias in the engine (vLLM's SamplingParams).

References are transformers' own forward on the same weights: a prompt token's logprob
is log_softmax of the logits at the position before it.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core import SamplingParamsError
from tests.engine.hf_greedy import hf_model

PROMPT = list(range(40, 58))  # 18 tokens, block 4: a partial last block


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(model=tiny_llama, block_size=4, num_kv_blocks=128, max_model_len=96)


def _hf_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = hf_model(path)(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # [P, V]: row p scores token p + 1


def _check_against_hf(path, ids, plp, n):
    ref = _hf_logprobs(path, ids)
    assert len(plp) == len(ids) and plp[0] is None
    for p, e in enumerate(plp[1:]):
        row = ref[p]
        assert e.token_id == ids[p + 1]
        assert e.logprob == pytest.approx(row[ids[p + 1]].item(), abs=1e-4)
        assert e.rank == int((row > row[ids[p + 1]]).sum()) + 1
        top = row.topk(n)
        assert [t for t, _ in e.top_logprobs] == top.indices.tolist()
        assert [lp for _, lp in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_prompt_logprobs_equal_a_full_forward_chunked_or_not_and_skip_the_prefix_cache(tiny_llama):
    whole = LLM(model=tiny_llama, block_size=4, num_kv_blocks=128, max_model_len=96)  # a cold cache
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    first = whole.generate([PROMPT], params)[0]
    _check_against_hf(tiny_llama, PROMPT, first.prompt_logprobs, 3)
    # the same prompt again: its blocks are cached, but a request with prompt logprobs
    # reads no hit (vLLM's skip_reading_prefix_cache) and gets every value again
    plain = whole.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2))[0]
    assert plain.num_cached_tokens == 16 and plain.prompt_logprobs is None
    again = whole.generate([PROMPT], params)[0]
    assert again.num_cached_tokens == 0 and again.prompt_logprobs == first.prompt_logprobs
    # chunked prefill (5 tokens a step): each chunk's last row scores the next chunk's
    # first token, and the values equal the unchunked ones
    chunked = LLM(model=tiny_llama, block_size=4, num_kv_blocks=128, max_model_len=96,
                  max_num_batched_tokens=5, long_prefill_token_threshold=5)
    out = chunked.generate([PROMPT], params)[0]
    assert [e and (e.token_id, e.rank) for e in out.prompt_logprobs] == \
        [e and (e.token_id, e.rank) for e in first.prompt_logprobs]
    assert [e.logprob for e in out.prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in first.prompt_logprobs[1:]], abs=1e-5)
    assert out.outputs[0].token_ids == first.outputs[0].token_ids


def test_prompt_logprobs_zero_gives_each_prompt_token_alone(llm, tiny_llama):
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))[0]
    assert len(out.prompt_logprobs) == len(PROMPT)
    assert all(e.top_logprobs == () for e in out.prompt_logprobs[1:])


def test_prompt_logprobs_with_n_come_once_from_the_request(llm, tiny_llama):
    out = llm.generate([PROMPT], SamplingParams(temperature=1.0, n=3, seed=1, max_tokens=3,
                                                prompt_logprobs=1))[0]
    assert len(out.prompt_logprobs) == len(PROMPT) and len(out.outputs) == 3


def test_allowed_token_ids_restrict_the_sample_and_logit_bias_moves_it(llm, tiny_llama):
    allowed = [7, 11, 13]
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=0,
                                                allowed_token_ids=allowed))[0].outputs[0]
    row = _hf_logprobs(tiny_llama, PROMPT)[-1]
    best = max(allowed, key=lambda t: row[t].item())
    assert out.token_ids == [best]
    # logprobs stay those of the raw distribution, as vLLM's raw_logprobs
    assert out.logprobs[0][best] == pytest.approx(row[best].item(), abs=1e-4)
    # a bias of +100 on the least likely token makes greedy pick it
    worst = int(row.argmin())
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1,
                                                logit_bias={str(worst): 100.0}))[0].outputs[0]
    assert out.token_ids == [worst]
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1,
                                                logit_bias={worst: -100.0}))[0].outputs[0]
    assert out.token_ids == [int(row.argmax())]


@pytest.mark.parametrize("field, value", [("stop_token_ids", [10**6]), ("allowed_token_ids", [10**6]),
                                          ("logit_bias", {10**6: 1.0})])
def test_out_of_vocab_token_ids_are_refused(llm, field, value):
    with pytest.raises(SamplingParamsError, match=f"^{field} contain out-of-vocab token ids"):
        llm.engine.add_request(PROMPT, SamplingParams(max_tokens=1, **{field: value}))
    assert not llm.engine.has_unfinished_requests()

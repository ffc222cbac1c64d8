"""Greedy decoding, token for token: real vLLM (``vllm serve``) against kvscope's offline
``LLM`` on the same float32 weights, block size 32.

vLLM answers first (every request finished), then kvscope's engine runs in this process:
the two are never busy at once. A divergence is reported at its first token, with both
engines' top-2 logprobs there: two float32 CPU stacks may legitimately flip a near tie.
"""

from __future__ import annotations

import time

import pytest

from bench.vllm_servers import BLOCK_SIZE, MAX_MODEL_LEN, MODEL_NAME

pytestmark = pytest.mark.vllm

MAX_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Question: What is 12 times 12?\nAnswer:",
    "Paged attention stores the key-value cache in fixed-size blocks so that",
    "My favourite recipe for pancakes starts with",
    "Translate to French: 'Good morning, how are you?'\n",
    "A list of five animals that live in the ocean:\n1.",
    "In 1969, the first humans to walk on the Moon were",
]


def _top2(entry: dict) -> str:
    return ", ".join(f"{k!r}: {v:.4f}" for k, v in sorted(entry.items(), key=lambda kv: -kv[1])[:2])


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.fixture(scope="module")
def vllm_answers(vllm_server):
    from openai import OpenAI

    client = OpenAI(base_url=vllm_server.api_url, api_key="unused", timeout=300)
    answers = []
    for prompt in PROMPTS:
        r = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=2,
            extra_body={"return_token_ids": True, "ignore_eos": True})
        c = r.choices[0]
        answers.append({"prompt_token_ids": c.prompt_token_ids, "token_ids": c.token_ids,
                        "text": c.text, "top": c.logprobs.top_logprobs})
    return answers


@pytest.fixture(scope="module")
def kvscope_llm(vllm_answers):  # after vLLM has answered: one engine busy at a time
    from engine import LLM

    llm = LLM(block_size=BLOCK_SIZE, dtype="float32", max_model_len=MAX_MODEL_LEN)
    yield llm
    llm.close()


def test_greedy_completions_token_identical(vllm_answers, kvscope_llm):
    from engine import SamplingParams

    tok = kvscope_llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    start = time.perf_counter()
    outs = kvscope_llm.generate(PROMPTS, params)
    seconds = time.perf_counter() - start
    problems, equal = [], 0
    for prompt, v, out in zip(PROMPTS, vllm_answers, outs):
        if out.prompt_token_ids != v["prompt_token_ids"]:
            problems.append(f"{prompt!r}: prompt tokens differ: kvscope {out.prompt_token_ids} "
                            f"vLLM {v['prompt_token_ids']}")
            continue
        mine = list(out.outputs[0].token_ids)
        at = _first_divergence(mine, v["token_ids"])
        if at is None:
            equal += 1
            continue
        lp = out.outputs[0].logprobs
        kv_top = _top2({tok.decode([t]): p for t, p in lp[at].items()}) if lp and at < len(lp) else "?"
        vl_top = _top2(v["top"][at]) if at < len(v["top"]) else "?"
        problems.append(
            f"{prompt!r}: first divergence at output token {at}: kvscope {mine[at:at + 1]} "
            f"vLLM {v['token_ids'][at:at + 1]} (same before: {tok.decode(mine[:at])!r}); "
            f"top-2 kvscope {{{kv_top}}} vLLM {{{vl_top}}}")
    print(f"\ngreedy: {equal}/{len(PROMPTS)} token-identical over {MAX_TOKENS} tokens "
          f"(kvscope {seconds:.1f} s)")
    assert not problems, "\n".join(problems)

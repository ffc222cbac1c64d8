"""The prefix cache, request by request: ``usage.prompt_tokens_details.cached_tokens`` of a
real ``vllm serve`` and of ``kvscope serve`` on the same sequential chat workload (a long
shared system prompt, some questions asked twice), then again after ``POST
/reset_prefix_cache`` on both. Same block size (32), same weights, greedy: the prompt
tokens, the hits and the answers must all be equal.

vLLM gets the whole workload first, then kvscope: never both busy.
"""

from __future__ import annotations

import pytest

from bench.vllm_servers import DEFAULT_KVSCOPE_BLOCKS, MODEL_NAME

pytestmark = pytest.mark.vllm

SYSTEM = (
    "You are KV, a patient teaching assistant for a course on large language model inference. "
    "You explain how transformer decoders generate text one token at a time, why every layer "
    "keeps the keys and values of earlier tokens, and how an inference server manages that "
    "memory. You know paged attention well: the cache is split into fixed-size blocks, a block "
    "table maps each sequence's logical blocks to physical ones, and blocks are allocated on "
    "demand, so little memory is wasted on fragmentation. You also know prefix caching: a full "
    "block is identified by a hash of its tokens and of every token before it, so requests that "
    "share a prefix, such as this very system prompt, reuse the cached blocks instead of "
    "computing them again. When the pool runs out, the scheduler preempts the newest request "
    "and recomputes it later. Answer in two or three short sentences, use plain words, and "
    "give a small concrete example whenever it helps the student understand. Never invent "
    "numbers you were not given."
)
# Asked twice: its prompt has full blocks past the system prompt's, which only a repeat hits.
LONG = ("Suppose a server holds sixteen requests that all share a long system prompt, and then a "
        "seventeenth request arrives whose first hundred tokens match one of them: which of its "
        "blocks are served from the cache, which are computed, and why is the last one special?")
QUESTIONS = [
    "What is a KV cache?", "Why are blocks a fixed size?", "What is a block table?",
    "What is a KV cache?", "How does prefix caching find a hit?", "What happens on preemption?",
    "Why does fragmentation waste memory?", "What is a block table?", "What is chunked prefill?",
    "How big is one block?", "What is a KV cache?", "Why hash the whole prefix?",
    "What does eviction mean here?", "Is the system prompt cached?", "What is decode?",
    "What is prefill?", "How does prefix caching find a hit?", "What is copy-on-write?",
    LONG, "Why recompute instead of swapping?", "What is a block table?", LONG,
]
AFTER_RESET = ["What is a KV cache?", "What is a KV cache?", LONG, "What is decode?", LONG,
               "Why are blocks a fixed size?"]
MAX_TOKENS = 12


def _run(server) -> list[dict]:
    """The workload on one server, sequentially: reset, 22 requests, reset, 6 requests."""
    from openai import OpenAI

    client = OpenAI(base_url=server.api_url, api_key="unused", timeout=300)
    rows = []

    def ask(phase: str, question: str) -> None:
        r = client.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=MAX_TOKENS,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
        details = r.usage.prompt_tokens_details
        rows.append({"phase": phase, "question": question, "prompt_tokens": r.usage.prompt_tokens,
                     "cached_tokens": details.cached_tokens if details else None,
                     "completion_tokens": r.usage.completion_tokens,
                     "text": r.choices[0].message.content})

    assert server.reset_prefix_cache() == 200
    for q in QUESTIONS:
        ask("shared prefix", q)
    assert server.reset_prefix_cache() == 200
    for q in AFTER_RESET:
        ask("after reset", q)
    return rows


@pytest.fixture(scope="module")
def vllm_rows(vllm_server):
    return _run(vllm_server)


@pytest.fixture(scope="module")
def kvscope_rows(vllm_rows, kvscope_servers):
    # started only now, vLLM's workload done: one server busy at a time
    return _run(kvscope_servers(num_kv_blocks=DEFAULT_KVSCOPE_BLOCKS))


def test_cached_tokens_equal_request_by_request(vllm_rows, kvscope_rows):
    table = [f"{'#':>2} {'phase':13} {'prompt':>6} {'vLLM':>5} {'kvscope':>7}  question"]
    diffs = []
    for i, (v, k) in enumerate(zip(vllm_rows, kvscope_rows)):
        mark = "" if (v["cached_tokens"], v["prompt_tokens"]) == (k["cached_tokens"], k["prompt_tokens"]) else "  <--"
        table.append(f"{i:>2} {v['phase']:13} {v['prompt_tokens']:>6} {v['cached_tokens']!s:>5} "
                     f"{k['cached_tokens']!s:>7}  {v['question']}{mark}")
        if mark:
            diffs.append(i)
    print("\n" + "\n".join(table))
    assert len(vllm_rows) == len(kvscope_rows) == len(QUESTIONS) + len(AFTER_RESET)
    # the workload does exercise the cache: the system prompt is hit, a reset empties it
    assert vllm_rows[1]["cached_tokens"] >= 32 * 5
    assert vllm_rows[len(QUESTIONS)]["cached_tokens"] == 0
    assert not diffs, f"cached_tokens or prompt_tokens differ at requests {diffs}:\n" + "\n".join(table)


def test_greedy_answers_equal_on_the_shared_prefix_workload(vllm_rows, kvscope_rows):
    diffs = [(i, v["question"], v["text"], k["text"]) for i, (v, k) in enumerate(zip(vllm_rows, kvscope_rows))
             if (v["text"], v["completion_tokens"]) != (k["text"], k["completion_tokens"])]
    assert not diffs, "\n".join(f"#{i} {q!r}: vLLM {a!r} kvscope {b!r}" for i, q, a, b in diffs)

"""Preemption on a real ``vllm serve`` and on ``kvscope serve``, both pools at 64 usable
blocks of 32 tokens: 16 concurrent requests of 64 prompt tokens and 128 generated ones
(6 blocks each, 96 wanted at the peak) must preempt; both preempt the same number of
times (``vllm:num_preemptions``, and per request ``vllm:request_num_preemptions``), every
other counter and histogram count equals too (``iteration_tokens_total`` counts the
recomputation out), and every answer equals the same request's answer on the unpressured
default pools (364 blocks).

The same steps on both servers: the 16 arrive while a "gate" request (a 1,500-token
prompt, one token) holds the first step, so the next step admits all 16 at once on either
server, whatever the order they arrived in; all 16 have the same lengths and share no
block, so which one is preempted when does not depend on that order. vLLM runs each
phase first, then kvscope: never both busy.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.vllm import prom_diff
from bench.vllm_servers import DEFAULT_KVSCOPE_BLOCKS, MODEL_NAME
from tests.vllm.test_metrics import LABELS, VLLM_SCHEDULER_ARGS
from tests.vllm.test_prefix_cache import LONG, SYSTEM

pytestmark = pytest.mark.vllm

# module order (tests/vllm/conftest.py): after the modules on the default vLLM pool
VLLM_CONFIG = {"num_gpu_blocks_override": 65}
USABLE_BLOCKS = 64  # vLLM keeps one of its 65 as the null block
N_REQUESTS, PROMPT_LEN, MAX_TOKENS = 16, 64, 128
GATE = [7 + i % 5000 for i in range(1500)]  # token ids no request below shares
TEXT = f"{SYSTEM} {LONG}"  # ~250 tokens of English: its 64-token windows are the prompts
GATE_HOLD_S = 1.0  # the gate's 1,500-token step takes several seconds on either server


def _complete(server, prompt, max_tokens):
    from openai import OpenAI

    client = OpenAI(base_url=server.api_url, api_key="unused", timeout=600)
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=max_tokens,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text, r.usage.completion_tokens


def _prompts(model_dir) -> list[list[int]]:
    """16 windows of TEXT, each 64 tokens, starting 3 tokens apart: English (greedy answers
    to random token ids are near-ties that float32 kernels break differently), and no two
    share a block."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(f"{model_dir}/tokenizer.json").encode(TEXT, add_special_tokens=False).ids
    assert len(ids) >= 3 * N_REQUESTS + PROMPT_LEN
    return [ids[3 * r: 3 * r + PROMPT_LEN] for r in range(N_REQUESTS)]


def _run(server, prompts) -> dict:
    """The gate, then the 16 while it runs; the answers and the /metrics deltas."""
    assert server.reset_prefix_cache() == 200
    before = prom_diff.scrape(server)
    with ThreadPoolExecutor(N_REQUESTS + 1) as pool:
        gate = pool.submit(_complete, server, GATE, 1)
        time.sleep(GATE_HOLD_S)
        answers = list(pool.map(lambda p: _complete(server, p, MAX_TOKENS), prompts))
        gate.result()
    after = prom_diff.scrape(server)
    return {"answers": answers, "after": after,
            "deltas": prom_diff.comparable(prom_diff.deltas(before, after), after)}


@pytest.fixture(scope="module")
def runs(model_dir, vllm_servers, kvscope_servers):
    prompts = _prompts(model_dir)
    out = {}
    # unpressured first, on the default pools (the other modules' servers), vLLM then kvscope
    out["vllm", "free"] = _run(vllm_servers(), prompts)
    out["kvscope", "free"] = _run(kvscope_servers(num_kv_blocks=DEFAULT_KVSCOPE_BLOCKS,
                                                  extra_args=VLLM_SCHEDULER_ARGS), prompts)
    out["vllm", "pressed"] = _run(vllm_servers(**VLLM_CONFIG), prompts)
    out["kvscope", "pressed"] = _run(kvscope_servers(num_kv_blocks=USABLE_BLOCKS,
                                                     extra_args=VLLM_SCHEDULER_ARGS), prompts)
    return out




def _get(run, name):
    return run["deltas"][(name, LABELS)]


def test_the_pool_is_the_same_size(runs):
    v = runs["vllm", "pressed"]["after"].labels_of("vllm:cache_config_info")
    k = runs["kvscope", "pressed"]["after"].labels_of("vllm:cache_config_info")
    assert (int(v["num_gpu_blocks"]) - 1, int(k["num_gpu_blocks"])) == (USABLE_BLOCKS, USABLE_BLOCKS)


def test_equal_preemptions(runs):
    v, k = runs["vllm", "pressed"], runs["kvscope", "pressed"]
    figures = {name: (_get(v, name), _get(k, name)) for name in (
        "vllm:num_preemptions_total", "vllm:request_num_preemptions_sum", "vllm:request_num_preemptions_count",
        "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum")}
    print("\n(vLLM, kvscope):", figures)
    assert _get(v, "vllm:num_preemptions_total") > 0  # the pool was pressed
    assert _get(runs["vllm", "free"], "vllm:num_preemptions_total") == 0  # and the default one was not
    assert _get(v, "vllm:num_preemptions_total") == _get(k, "vllm:num_preemptions_total")
    assert _get(v, "vllm:request_num_preemptions_sum") == _get(v, "vllm:num_preemptions_total")
    buckets = [{dict(labels)["le"]: value for (name, labels), value in run["deltas"].items()
                if name == "vllm:request_num_preemptions_bucket"} for run in (v, k)]
    print("request_num_preemptions buckets (vLLM, kvscope):", buckets)
    assert len(buckets[0]) == 8 and buckets[0] == buckets[1]  # vLLM's 7 bounds and +Inf


@pytest.mark.parametrize("phase", ["free", "pressed"])
def test_every_counter_and_histogram_count_equal(runs, phase):
    diffs = prom_diff.differences(runs["vllm", phase]["deltas"], runs["kvscope", phase]["deltas"])
    assert not diffs, f"{len(diffs)} samples differ:\n" + "\n".join(diffs)


@pytest.mark.parametrize("engine", ["vllm", "kvscope"])
def test_answers_equal_the_unpressured_ones(runs, engine):
    free, pressed = runs[engine, "free"]["answers"], runs[engine, "pressed"]["answers"]
    assert len(free) == N_REQUESTS and all(n == MAX_TOKENS for _, n in free)
    diffs = [i for i, (a, b) in enumerate(zip(free, pressed)) if a != b]
    assert not diffs, f"{engine}: requests {diffs} answered otherwise under preemption"


def test_kvscope_answers_equal_vllms(runs):
    v, k = runs["vllm", "free"]["answers"], runs["kvscope", "free"]["answers"]
    diffs = [(i, a, b) for i, (a, b) in enumerate(zip(v, k)) if a != b]
    assert not diffs, "\n".join(f"#{i}: vLLM {a!r}\n    kvscope {b!r}" for i, a, b in diffs)

"""``/metrics`` of a real ``vllm serve`` and of ``kvscope serve`` after the same workload:
the same ``vllm:*`` families (name, type, label names, help) except the listed ones
(tests/vllm/prom_diff.py, with the reason each), and equal values: every counter, every
histogram's ``_count``, the ``_sum`` and buckets of every token histogram (the latency
histograms' ``_sum`` and buckets are wall-clock times: only their ``_count`` is compared),
the gauges of the idle servers, and ``vllm:cache_config_info``'s labels.

The workload runs one request at a time (each server steps the same batches, so
``iteration_tokens_total`` sees the same steps): chats sharing a long system prompt (prefix
hits), some asked twice, one-token answers, ``ignore_eos`` completions of token ids, a stop
string and a stop token id. kvscope is scheduled as vLLM's CPU API server is
(``VLLM_SCHEDULER_ARGS``). vLLM gets the whole workload first, then kvscope.
"""

from __future__ import annotations

import pytest

from tests.vllm import prom_diff
from bench.vllm_servers import DEFAULT_KVSCOPE_BLOCKS, MODEL_NAME
from tests.vllm.test_prefix_cache import LONG, SYSTEM

pytestmark = pytest.mark.vllm

# vLLM 0.32's defaults for `vllm serve` on CPU (vllm/engine/arg_utils.py: 2048 tokens and 128
# sequences a step); kvscope's own are 512 and 64, which chunk and batch differently.
VLLM_SCHEDULER_ARGS = ("--max-num-batched-tokens", "2048", "--max-num-seqs", "128")

LABELS = tuple(sorted(prom_diff.NORMALISED.items()))  # a series' labels once normalised
QUESTIONS = ["What is a KV cache?", "Why are blocks a fixed size?", "What is a KV cache?", LONG,
             "What happens on preemption?", LONG, "What is a block table?"]


def workload(server) -> list[dict]:
    """The requests, one at a time; returns what each answered (to check the runs are alike)."""
    from openai import OpenAI

    client = OpenAI(base_url=server.api_url, api_key="unused", timeout=300)
    rows = []

    def chat(question: str, **kw) -> None:
        r = client.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=kw.pop("max_tokens", 10),
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], **kw)
        rows.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage.prompt_tokens,
                     r.usage.completion_tokens))

    def complete(prompt, **kw) -> None:
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, **kw)
        rows.append((r.choices[0].text, r.choices[0].finish_reason, r.usage.prompt_tokens,
                     r.usage.completion_tokens))

    assert server.reset_prefix_cache() == 200
    for q in QUESTIONS:
        chat(q)
    chat("What is decode?", max_tokens=1)  # one token: no inter-token latency, TPOT 0
    complete("The capital of France is", max_tokens=30, stop=[" the"])  # cut at a stop string
    complete(list(range(1000, 1070)), max_tokens=24, extra_body={"ignore_eos": True})  # 70 token ids
    complete(list(range(1000, 1070)), max_tokens=5, extra_body={"ignore_eos": True})  # its 2 full blocks hit
    complete("One, two, three,", max_tokens=20, extra_body={"stop_token_ids": [28]})  # "," (SmolLM2)
    return rows


@pytest.fixture(scope="module")
def vllm_scrapes(vllm_server):
    before = prom_diff.scrape(vllm_server)
    rows = workload(vllm_server)
    return before, prom_diff.scrape(vllm_server), rows


@pytest.fixture(scope="module")
def kvscope_scrapes(vllm_scrapes, kvscope_servers):
    # started only now, vLLM's workload done: one server busy at a time
    server = kvscope_servers(num_kv_blocks=DEFAULT_KVSCOPE_BLOCKS, extra_args=VLLM_SCHEDULER_ARGS)
    before = prom_diff.scrape(server)
    rows = workload(server)
    return before, prom_diff.scrape(server), rows


def test_same_answers(vllm_scrapes, kvscope_scrapes):
    """The two runs did the same work (else a metric difference would say nothing)."""
    assert vllm_scrapes[2] == kvscope_scrapes[2]
    assert {r[1] for r in vllm_scrapes[2]} == {"stop", "length"}


def test_same_families_except_the_listed_ones(vllm_scrapes, kvscope_scrapes):
    v, k = vllm_scrapes[1], kvscope_scrapes[1]
    # the lists name what the real vLLM exports, not what it might
    assert set(prom_diff.VLLM_ONLY) <= set(v.families) and not set(prom_diff.VLLM_ONLY) & set(k.families)
    assert set(prom_diff.ONLY_IN_KVSCOPE) <= set(k.families) and not set(prom_diff.ONLY_IN_KVSCOPE) & set(v.families)
    vf = prom_diff.compared_families(v, prom_diff.VLLM_ONLY)
    kf = prom_diff.compared_families(k, prom_diff.ONLY_IN_KVSCOPE)
    diffs = [f"{n}: vLLM {vf.get(n)} kvscope {kf.get(n)}" for n in sorted(set(vf) | set(kf)) if vf.get(n) != kf.get(n)]
    assert not diffs, "\n".join(diffs)
    # every histogram's buckets, the latency ones included (their counts per bucket are times)
    histograms = [n for n, f in vf.items() if f.type == "histogram"]
    assert len(histograms) == 16
    bucket_diffs = {n: (v.bounds(n), k.bounds(n)) for n in histograms if v.bounds(n) != k.bounds(n)}
    assert not bucket_diffs, bucket_diffs
    assert "vllm:prompt_tokens_recomputed" not in k.families  # not a vLLM 0.32 metric


def test_every_counter_and_histogram_count_equal(vllm_scrapes, kvscope_scrapes):
    v = prom_diff.comparable(prom_diff.deltas(*vllm_scrapes[:2]), vllm_scrapes[1])
    k = prom_diff.comparable(prom_diff.deltas(*kvscope_scrapes[:2]), kvscope_scrapes[1])
    figures = {name: (v[name, LABELS], k.get((name, LABELS))) for name in (
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_hits_total",
        "vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum", "vllm:num_preemptions_total")}
    print(f"\n{len(v)} samples compared; (vLLM, kvscope):", figures)
    assert v["vllm:prefix_cache_hits_total", LABELS] > 0
    diffs = prom_diff.differences(v, k)
    assert not diffs, f"{len(diffs)} of {len(v)} samples differ:\n" + "\n".join(diffs)


def test_cache_config_info_labels(vllm_scrapes, kvscope_scrapes):
    v = vllm_scrapes[1].labels_of("vllm:cache_config_info")
    k = kvscope_scrapes[1].labels_of("vllm:cache_config_info")
    assert set(v) == set(k)
    diffs = {n: (v[n], k[n]) for n in v if v[n] != k[n] and n not in prom_diff.CACHE_CONFIG_DIFFERENT}
    assert not diffs, diffs
    # what the differences are, on the default pools (364 blocks, one null)
    assert (v["num_gpu_blocks"], k["num_gpu_blocks"]) == ("364", str(DEFAULT_KVSCOPE_BLOCKS))
    assert (v["hash_block_size"], k["hash_block_size"]) == ("None", "32")

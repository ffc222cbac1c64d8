"""Smoke test of the bench harness on the tiny model: report structure and identical
greedy tokens on both systems. Timings are not checked (shared CI machine)."""

from __future__ import annotations

import json

import pytest

from bench import roofline, workloads as W
from bench.report import BEGIN, END, render_markdown, update_results_md, write_json
from bench.roofline import RooflineScale, decode_step_work, model_costs, prefill_work
from bench.suite import BenchOptions, run_bench

TINY = W.Scale(mixed_requests=6, mixed_prompt_median=12, mixed_prompt_range=(4, 40),
               mixed_output_median=6, mixed_output_range=(2, 12), shared_requests=5,
               shared_prefix_tokens=40, shared_output_range=(3, 6), long_prompt_tokens=120, events_max_tokens=8,
               short_requests=3, long_short_output=4)

TINY_ROOFLINE = RooflineScale(decode_batches=(4, 1), decode_steps={4: 2, 1: 3}, prompt_len=16,
                              prefill_tokens=64, prefill_repeats=1)

METRICS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "e2e_s", "peak_rss_mib",
           "kv_reserved_mib", "kv_used_peak_mib")


@pytest.fixture(scope="module")
def results(tiny_llama):
    opts = BenchOptions(model=tiny_llama, scale=TINY, scale_name="tiny", max_num_seqs=4,
                        num_kv_blocks=128, roofline=TINY_ROOFLINE, progress=False)
    return run_bench(opts)


def test_every_workload_has_both_systems_and_all_metrics(results):
    assert set(results["workloads"]) == set(W.WORKLOADS)
    for name, entry in results["workloads"].items():
        assert {"kvscope", "hf_static"} <= set(entry["systems"]), name
        for system in entry["systems"].values():
            for key in METRICS:
                assert system[key] is not None and system[key] >= 0, (name, key)
        assert entry["ratios"]["throughput"] > 0
    ls = results["workloads"]["long_short"]
    assert "kvscope_no_chunk" in ls["systems"]
    assert ls["ratios"]["short_ttft_p50_chunked_vs_unchunked"] > 0
    assert {"cpu", "cores", "torch", "torch_threads"} <= set(results["machine"])
    assert {t["target"].split(":")[0] for t in results["targets"]} >= {"mixed", "shared prefix",
                                                                        "long+short", "events"}


def test_both_systems_produce_identical_greedy_tokens(results):
    for name, entry in results["workloads"].items():
        tm = entry["token_match"]
        assert tm["identical_requests"] == tm["requests"], (name, tm)
    tc = results["workloads"]["long_short"]["token_match_chunked_vs_unchunked"]
    assert tc["identical_requests"] == tc["requests"]


def test_shared_prefix_is_served_from_cache(results):
    # the first requests all start in step 1, before any block is cached (same as vLLM);
    # the one that waits for a free sequence slot hits
    kv = results["workloads"]["shared_prefix"]["systems"]["kvscope"]
    assert 0 < kv["shared_prefix_tokens_from_cache"] <= 1
    assert kv["prefix_cache_hit_tokens"] > 0


def test_events_cost_ran_both_modes(results):
    ev = results["events_cost"]
    assert ev["output_tokens"]["off"] > 0 and ev["output_tokens"]["on"] > 0
    # each pass alternates off on on off ...: at most one unpaired step per pass
    assert abs(ev["steps"]["off"] - ev["steps"]["on"]) <= ev["repeats"] == 3
    assert len(ev["loss_engine_thread_per_pass"]) == 3 and ev["pairs"] > 0
    assert -1 < ev["loss"] < 1
    assert ev["rows_recorded"] > 0 and ev["recorder_ok"]


def test_model_costs_come_from_the_shapes(tiny_llama):
    from engine.model.loader import load_model

    loaded = load_model(tiny_llama)
    c = loaded.hf_config
    hd = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    costs = model_costs(loaded)
    assert costs.linear_weights == c.num_hidden_layers * per_layer
    assert costs.lm_head_weights == c.vocab_size * c.hidden_size
    assert costs.decode_flops_per_token == 2 * (costs.linear_weights + costs.lm_head_weights)
    assert costs.weight_bytes == 4 * (costs.linear_weights + costs.lm_head_weights)  # float32
    assert costs.attn_flops_per_ctx == 4 * q * c.num_hidden_layers
    assert costs.kv_bytes_per_ctx == 2 * kv * c.num_hidden_layers * 4
    flops, nbytes = decode_step_work(costs, batch=3, context=10)
    assert flops == 3 * (costs.decode_flops_per_token + 10 * costs.attn_flops_per_ctx)
    assert nbytes == costs.weight_bytes + 3 * 10 * costs.kv_bytes_per_ctx
    flops, _ = prefill_work(costs, 8)  # lm_head for the one sampled row, causal attention
    assert flops == 2 * costs.linear_weights * 8 + 2 * costs.lm_head_weights + costs.attn_flops_per_ctx * 36


def test_roofline_rows_and_targets(results):
    roof = results["roofline"]
    assert roof["ceilings"]["gemm_gflops"] > 0 and roof["ceilings"]["read_gbps"] > 0
    assert set(roof["units"]) == {"decode_4", "decode_1", "prefill_64"}
    d4 = roof["units"]["decode_4"]
    # 16-token prompts, then 2 untimed warm-up steps: the timed steps see contexts 19, 20
    assert roofline.WARMUP_STEPS == 2
    assert d4["steps"] == 2 and d4["context"] == 19.5
    assert d4["tokens_per_s"] == 4 / d4["median_step_s"]
    for u in roof["units"].values():
        assert 0 < u["flops_fraction"] and 0 < u["bytes_fraction"]
        assert u["roofline_fraction"] == max(u["flops_fraction"], u["bytes_fraction"])
    targets = {t["target"] for t in results["targets"]}
    assert any(t.startswith("roofline: 1-sequence decode") for t in targets)  # decode_64 not run here
    assert "#### roofline" in render_markdown(results)


def test_report_keeps_other_sections(results, tmp_path):
    md = render_markdown(results)
    assert "| metric |" in md and "kvscope / baseline" in md
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## GPU check\n\nkeep me\n")
    update_results_md(md, path)
    update_results_md(md, path)  # a second run replaces, never duplicates
    text = path.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and "keep me" in text
    write_json(results, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["workloads"]


def test_api_overhead_runs_both_ways_with_identical_tokens(tiny_llama):
    from bench.api_overhead import render, run

    scale = W.Scale(mixed_requests=4, mixed_prompt_median=12, mixed_prompt_range=(4, 30),
                    mixed_output_median=6, mixed_output_range=(2, 10))
    res = run(tiny_llama, 1, scale, {"max_model_len": 128, "num_kv_blocks": 128})
    assert res["tokens_identical"] and res["requests"] == 4
    assert [len(res["runs"][m]) for m in ("offline", "served")] == [1, 1]
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 for rs in res["runs"].values() for r in rs)
    assert "| 16 streaming API clients: throughput served / LLM.generate | >= 0.9 |" in render(res)

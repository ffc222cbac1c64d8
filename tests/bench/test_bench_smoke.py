"""Smoke test of the bench harness on the tiny model: report structure and identical
greedy tokens on both systems. Timings are not checked (shared CI machine)."""

from __future__ import annotations

import json

import pytest

from bench import workloads as W
from bench.report import BEGIN, END, render_markdown, update_results_md, write_json
from bench.suite import BenchOptions, run_bench

TINY = W.Scale(mixed_requests=6, mixed_prompt_median=12, mixed_prompt_range=(4, 40),
               mixed_output_median=6, mixed_output_range=(2, 12), shared_requests=5,
               shared_prefix_tokens=40, shared_output_range=(3, 6), long_prompt_tokens=120, events_max_tokens=8,
               short_requests=3, long_short_output=4)

METRICS = ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "e2e_s", "peak_rss_mib",
           "kv_reserved_mib", "kv_used_peak_mib")


@pytest.fixture(scope="module")
def results(tiny_llama):
    opts = BenchOptions(model=tiny_llama, scale=TINY, scale_name="tiny", max_num_seqs=4,
                        num_kv_blocks=128, progress=False)
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

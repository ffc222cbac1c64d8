"""``kvscope bench --baseline vllm`` (bench/vllm_compare.py) on the tier's two servers, at a
small size: the runs alternate, every request gets its tokens on both, the outputs are
compared, the figures and the RESULTS.md block come from the runs."""

from bench import vllm_compare
from bench.report import update_results_md


def test_the_comparison_runs_alternating_and_compares_outputs(vllm_server, kvscope_servers, tmp_path):
    kv = kvscope_servers()
    opts = vllm_compare.Options(concurrency=(1, 4), requests=4, requests_at_1=2, prompt_tokens=40,
                                output_tokens=6, pairs=2)
    res = vllm_compare.compare_servers(opts, vllm_server, kv, progress=lambda s: None)
    runs = res["runs"]
    # per concurrency: vLLM, kvscope, then kvscope, vLLM (the order swaps every pair)
    assert [(r["concurrency"], r["pair"], r["server"]) for r in runs] == [
        (1, 0, "vllm"), (1, 0, "kvscope"), (1, 1, "kvscope"), (1, 1, "vllm"),
        (4, 0, "vllm"), (4, 0, "kvscope"), (4, 1, "kvscope"), (4, 1, "vllm")]
    for r in runs:
        assert r["output_tokens"] == r["num_requests"] * 6 and r["tok_s"] > 0
        assert r["ttft_p50_s"] > 0 and r["itl_p50_s"] > 0 and r["other_cpu_s"] >= 0
    assert res["outputs_identical"], res["mismatched_requests"]  # greedy, same weights
    by_c = {row["concurrency"]: row for row in res["rows"]}
    assert by_c[4]["num_requests"] == 4 and by_c[1]["num_requests"] == 2
    for c, row in by_c.items():
        k = sorted(r["tok_s"] for r in runs if r["concurrency"] == c and r["server"] == "kvscope")
        v = sorted(r["tok_s"] for r in runs if r["concurrency"] == c and r["server"] == "vllm")
        assert row["ratio"] == (sum(k) / 2) / (sum(v) / 2)  # medians of two
    md = vllm_compare.render_markdown(res)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## CPU\n\nkept\n")
    update_results_md(md, results, vllm_compare.BEGIN, vllm_compare.END, heading=vllm_compare.SECTION)
    update_results_md(md, results, vllm_compare.BEGIN, vllm_compare.END, heading=vllm_compare.SECTION)
    text = results.read_text()
    assert text.count(vllm_compare.BEGIN) == 1 and "kept" in text
    assert f"**{by_c[4]['ratio']:.2f}**" in text

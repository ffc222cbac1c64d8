"""README's benchmark paragraph is what bench/readme_block.py makes of bench/results_cpu.json."""

import json

from bench.measure import cpu_label
from bench.readme_block import (BEGIN, END, JSON, README, VLLM_BF16_JSON, VLLM_DEFAULTS_JSON, VLLM_JSON, block,
                                readme_block, update_readme)


def test_readme_quotes_the_committed_results_exactly():
    results = json.loads(JSON.read_text())
    vllm, bf16, defaults = (json.loads(p.read_text()) if p.exists() else None
                            for p in (VLLM_JSON, VLLM_BF16_JSON, VLLM_DEFAULTS_JSON))
    assert readme_block(README.read_text()) == block(results, vllm, bf16, defaults)
    for res in (vllm, bf16, defaults):  # every ratio against vLLM comes from its JSON
        for r in (res or {}).get("rows", []):
            assert f"{r['ratio']:.2f}x at concurrency {r['concurrency']}" in readme_block(README.read_text())
    if bf16:
        assert "In bfloat16 on both sides" in readme_block(README.read_text())
    if defaults:
        assert "With each engine at its own thread default" in readme_block(README.read_text())
    for res in (results, vllm, bf16, defaults):  # each run says which CPU it ran on (they differ between sessions)
        if res:
            assert f"on {cpu_label(res['machine'])}" in readme_block(README.read_text())
    text = block(results)
    for t in results["targets"]:  # every headline figure comes from the JSON
        v = t["value"]
        as_share = any(w in t["target"] for w in ("loss", "cache", "roofline"))
        shown = f"{100 * v:.1f}%" if as_share else f"{v:.2f}x"
        assert shown in text, (t["target"], shown)


def test_update_rewrites_only_the_block(tmp_path):
    results = json.loads(JSON.read_text())
    results["targets"][0]["value"] = 9.99
    j = tmp_path / "r.json"
    j.write_text(json.dumps(results))
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{BEGIN}\nstale 3.8x\n{END}\ntail\n")
    assert update_readme(j, readme, vllm_json=tmp_path / "none.json", vllm_bf16_json=tmp_path / "none.json",
                         vllm_defaults_json=tmp_path / "none.json") is True
    out = readme.read_text()
    assert out.startswith("head\n") and out.endswith("\ntail\n") and "9.99x" in out
    assert "stale" not in out and update_readme(j, readme, vllm_json=tmp_path / "none.json", vllm_bf16_json=tmp_path / "none.json",
                         vllm_defaults_json=tmp_path / "none.json") is False


def test_a_result_names_its_cpu_and_what_its_kernels_can_use():
    from bench.measure import machine_info

    assert cpu_label({"cores": 2, "cpu": "AMD EPYC", "isa": ["avx2"]}) == "a 2-core AMD EPYC (avx2)"
    assert cpu_label({"cores": 2, "cpu": "Intel(R) Xeon(R) Processor"}) == "a 2-core Intel(R) Xeon(R) Processor"
    isa = machine_info()["isa"]
    flags = open("/proc/cpuinfo").read()
    assert all(f in flags for f in isa) and (("avx2" in isa) == (" avx2 " in flags.replace("\n", " ")))

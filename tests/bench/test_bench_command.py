"""``kvscope bench``'s options reach the suite as they say (no benchmark runs: the suite's
entry point is replaced by one that records its options)."""

from __future__ import annotations

import dataclasses

import pytest

from bench import suite, workloads as W
from engine.cli import build_parser


class _Stop(Exception):
    pass


def _options(monkeypatch, argv: list[str]) -> suite.BenchOptions:
    seen: list[suite.BenchOptions] = []

    def record(opts):
        seen.append(opts)
        raise _Stop

    monkeypatch.setattr(suite, "run_bench", record)
    monkeypatch.setattr(suite, "default_threads_env", lambda threads: None)
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(_Stop):
        args.func(args)
    return seen[0]


def test_mixed_requests_sets_only_the_mixed_request_count(monkeypatch):
    # issue 33's small-batch goal: 24 chat requests at max_num_seqs=8
    opts = _options(monkeypatch, ["--workloads", "mixed", "--mixed-requests", "24", "--max-num-seqs", "8"])
    assert opts.scale == dataclasses.replace(W.FULL, mixed_requests=24)
    assert opts.scale_name == "full, 24 mixed requests"
    assert opts.max_num_seqs == 8 and opts.workloads == ("mixed",)
    quick = _options(monkeypatch, ["--quick", "--mixed-requests", "24"])
    assert quick.scale == dataclasses.replace(W.QUICK, mixed_requests=24)
    assert quick.scale_name == "quick, 24 mixed requests"


def test_without_mixed_requests_the_scale_is_the_named_one(monkeypatch):
    assert _options(monkeypatch, []).scale is W.FULL
    assert _options(monkeypatch, ["--quick"]).scale is W.QUICK


def test_mixed_requests_below_one_is_refused():
    args = build_parser().parse_args(["bench", "--mixed-requests", "0"])
    assert args.func(args) == 2


def test_baseline_vllm_dtype_reaches_both_servers_and_keeps_its_own_results(monkeypatch, tmp_path):
    """``--baseline vllm --dtype bfloat16``: the option, its JSON file and its RESULTS.md block
    beside float32's (no server starts: the comparison is replaced by one that records)."""
    from bench import vllm_compare
    from bench.report import update_results_md

    seen = []

    def record(opts, json_path, results_md):
        seen.append((opts, json_path, results_md))
        return {"rows": []}

    monkeypatch.setattr(vllm_compare, "run_and_report", record)
    for argv, dtype, json_file in ((["--dtype", "bfloat16"], "bfloat16", vllm_compare.JSON_BF16),
                                   ([], "float32", vllm_compare.JSON)):
        args = build_parser().parse_args(["bench", "--baseline", "vllm", "--results", "", *argv])
        monkeypatch.setattr("bench.readme_block.update_readme", lambda *a, **k: False)
        assert args.func(args) == 0
        opts, json_path, _ = seen[-1]
        assert opts.dtype == dtype and json_path == str(json_file)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--baseline", "vllm", "--dtype", "float16"])

    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## CPU\n\nkept\n")
    section = vllm_compare.SECTION
    update_results_md("float32 table", results, *vllm_compare.markers("float32"), heading=section)
    for _ in range(2):  # a second run replaces its own block only
        update_results_md("bf16 table", results, *vllm_compare.markers("bfloat16"), heading=section)
    text = results.read_text()
    assert text.count(f"## {section}") == 1 and "kept" in text
    bf16_begin = vllm_compare.markers("bfloat16")[0]
    assert text.count(bf16_begin) == 1 and text.count(vllm_compare.BEGIN) == 1
    assert text.index(bf16_begin) < text.index("bf16 table") < text.index(vllm_compare.BEGIN)
    assert text.index("float32 table") > text.index(vllm_compare.BEGIN)

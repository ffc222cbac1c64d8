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

"""``kvscope simulate TRACE``: the real core on a request trace, one pod or a fleet.

TRACE is a JSONL file (kvscope's request format or Mooncake's), or a recorded run
(``run:ID``, or the bare id): an engine run replays its requests, an attached run gives
the requests its pods' BlockStored chains show (a lower bound). Settings default to the run's when the trace is a run, else
to the engine's defaults; ``--num-kv-blocks`` (or ``--kv-cache-memory`` with the bytes a
block takes) sizes each pod's pool. Torch-free: no model is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.core import CacheConfig, SchedulerConfig
from engine.core.hashing import DEFAULT_HASH_ALGO, HASH_ALGOS

SETTINGS = ("block_size", "num_kv_blocks", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens",
            "max_model_len", "enable_prefix_caching", "scheduling_policy", "prefix_caching_hash_algo")


def load_trace(spec: str, db: str | None, tokenizer: str | None):
    from engine.simulate.trace import read_jsonl, read_run

    path = Path(spec)
    if path.is_file():
        return read_jsonl(path, tokenizer)
    from engine.store.runs import RunStore, UnknownRunError

    run_id = spec.removeprefix("run:")
    try:
        return read_run(RunStore(db), run_id)
    except UnknownRunError:
        raise ValueError(f"{spec!r} is neither a trace file nor a recorded run") from None


def build_config(args: argparse.Namespace, trace) -> Any:
    from engine.simulate.cost import StepCost, default_cost
    from engine.simulate.simulation import SimConfig

    run = trace.config
    overridden = [k for k in SETTINGS if getattr(args, k) is not None]

    def pick(name: str, run_key: str, default: Any) -> Any:
        v = getattr(args, name)
        return v if v is not None else run.get(run_key, default)

    block_size = pick("block_size", "block_size", 16)
    longest = max((r.num_prompt_tokens + r.output_length for r in trace.requests), default=2)
    max_len = pick("max_model_len", "max_model_len", longest)  # what admits every request
    chunked = run.get("enable_chunked_prefill", True)
    budget = pick("max_num_batched_tokens", "max_num_batched_tokens", 512 if chunked else max_len)
    blocks = args.num_kv_blocks if args.num_kv_blocks is not None else None
    if blocks is None and args.kv_cache_memory is not None:
        per_block = args.kv_bytes_per_block or run.get("kv_bytes_per_block")
        if not per_block:
            raise ValueError("--kv-cache-memory needs the bytes a block takes: --kv-bytes-per-block, "
                             "or a trace from a recorded run (its config has them)")
        blocks = args.kv_cache_memory // int(per_block)
    if blocks is None:
        blocks = run.get("num_blocks")
    if blocks is None:
        raise ValueError("give each pod's pool: --num-kv-blocks B, or --kv-cache-memory M with "
                         "--kv-bytes-per-block")
    sched = SchedulerConfig(
        max_model_len=max_len, max_num_batched_tokens=budget,
        max_num_seqs=pick("max_num_seqs", "max_num_seqs", 64), enable_chunked_prefill=chunked,
        long_prefill_token_threshold=run.get("long_prefill_token_threshold", 0),
        policy=pick("scheduling_policy", "scheduling_policy", "fcfs"),
        fair_ratio=run.get("fair_ratio", 0))
    caching = args.enable_prefix_caching if args.enable_prefix_caching is not None else run.get(
        "enable_prefix_caching", True)
    cache = CacheConfig(block_size=block_size, num_blocks=int(blocks), enable_prefix_caching=caching,
                        prefix_caching_hash_algo=pick("prefix_caching_hash_algo", "prefix_caching_hash_algo",
                                                      DEFAULT_HASH_ALGO))
    arrivals = args.arrivals
    if arrivals == "auto":
        steps = trace.source.startswith("run:") and args.pods == 1 and not overridden
        arrivals = "steps" if steps else "times"
    cost = StepCost.parse(args.step_cost) if args.step_cost else default_cost()
    record_pods = getattr(args, "record_pods", None)
    if record_pods is not None:
        try:
            record_pods = tuple(int(k) for k in record_pods.split(","))
        except ValueError:
            raise ValueError(f"--record-pods {args.record_pods!r}: pod numbers, e.g. 0,3") from None
    return SimConfig(args.pods, args.router, sched, cache, cost, arrivals,
                     router_args=_router_args(getattr(args, "router_arg", None) or []), record_pods=record_pods,
                     miss_causes=getattr(args, "miss_causes", False))


def _router_args(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--router-arg {item!r}: use NAME=NUMBER (e.g. overlap_weight=2)") from None
    return out


def cmd_simulate(args: argparse.Namespace) -> int:
    from engine.simulate.report import format_summary, summarize
    from engine.simulate.simulation import simulate, simulate_recorded
    from engine.core.config import check_capacity
    from engine.core.errors import KVScopeError
    from engine.simulate.trace import TraceError

    try:
        trace = load_trace(args.trace, args.db, args.tokenizer)
        cfg = build_config(args, trace)
        check_capacity(cfg.cache, cfg.sched)  # each pool must hold one max_model_len sequence
    except (TraceError, ValueError, KVScopeError) as exc:
        print(f"kvscope simulate: {exc}", file=sys.stderr)
        return 1
    if args.sweep:
        return _sweep(args, trace, cfg)
    if args.record:
        result = simulate_recorded(trace, cfg, args.db, args.label)
    else:
        result = simulate(trace, cfg)
    summary = summarize(result)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def _sweep(args: argparse.Namespace, trace, cfg) -> int:
    from engine.simulate.sweep import capacity_figure, format_rows, parse_sweeps, run_sweep

    try:
        sweeps = parse_sweeps(args.sweep)
        rows = run_sweep(trace, cfg, sweeps, progress=None if args.json else
                         lambda r: print(f"  {r}", file=sys.stderr), workers=args.workers)
    except (ValueError, TypeError) as exc:
        print(f"kvscope simulate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(rows) if args.json else format_rows(rows))
    if args.figure:
        per_block = args.kv_bytes_per_block or trace.config.get("kv_bytes_per_block")
        fig = capacity_figure(rows, per_block)
        if args.figure.endswith(".png"):
            from engine.simulate.sweep import figure_png

            figure_png(fig, args.figure)
        elif args.figure.endswith(".json"):
            Path(args.figure).write_text(fig.to_json())
        else:
            fig.write_html(args.figure, include_plotlyjs=True)  # self-contained: no network needed
        print(f"capacity curve: {args.figure}", file=sys.stderr)
    return 0


def add_simulate_subcommands(subparsers: Any) -> None:
    from engine.core.config import SCHEDULING_POLICIES
    from engine.simulate.routers import ROUTERS

    p = subparsers.add_parser("simulate", help="what-if: the real scheduler and KV cache on a request "
                              "trace (no model), one pod or a fleet behind a router")
    p.add_argument("trace", help="a JSONL trace (kvscope's or Mooncake's format), or a recorded "
                   "run (run:ID): an engine run, or an attached run's BlockStored chains")
    p.add_argument("--pods", type=int, default=1)
    p.add_argument("--router", default="round-robin", choices=list(ROUTERS))
    p.add_argument("--num-kv-blocks", type=int, default=None, help="each pod's pool, in blocks")
    p.add_argument("--kv-cache-memory", type=int, default=None, help="each pod's KV budget in bytes")
    p.add_argument("--kv-bytes-per-block", type=int, default=None,
                   help="with --kv-cache-memory, for a trace that is not a recorded run")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    p.add_argument("--scheduling-policy", default=None, choices=list(SCHEDULING_POLICIES))
    p.add_argument("--prefix-caching-hash-algo", default=None, choices=HASH_ALGOS)
    p.add_argument("--step-cost", default=None, metavar="COEFFS|TABLE",
                   help="base,prefill,decode,context seconds, or a table in data/step_cost "
                   "(default: smollm2-135m-cpu)")
    p.add_argument("--arrivals", default="auto", choices=["auto", "times", "steps"],
                   help="times: at the trace's times; steps: before the recorded engine step "
                   "(a recorded run on one pod with its settings; auto picks it then)")
    p.add_argument("--tokenizer", default=None, help="a model directory, for traces of prompt text")
    p.add_argument("--record", action="store_true", help="record each pod as a 'simulated' run")
    p.add_argument("--record-pods", default=None, metavar="K1,K2",
                   help="with --record: record only these pods (numbered from 0); the others are "
                   "simulated the same but keep no events, and each run says which pods were kept")
    p.add_argument("--label", default=None)
    p.add_argument("--db", default=None, help="the run store (default: $KVSCOPE_DB or kvscope.db)")
    p.add_argument("--router-arg", action="append", metavar="NAME=NUMBER",
                   help="a router's own knob, e.g. overlap_weight=2 for dynamo")
    p.add_argument("--sweep", action="append", metavar="NAME=V1,V2",
                   help="run every combination (num_kv_blocks, block_size, pods, router, max_num_seqs, "
                   "max_num_batched_tokens) and print a table")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="with --sweep: run its simulations in N processes (one core each)")
    p.add_argument("--figure", default=None, metavar="FILE",
                   help="with --sweep: the capacity curve (hit rate against memory per router) as .html, "
                   ".json or .png (drawn by Chromium through playwright)")
    p.add_argument("--miss-causes", action="store_true",
                   help="split the misses into cold / evicted / partial (the miss-cause book: about a "
                   "third more CPU on a fleet-scale trace; hit rates, evictions and every decision the "
                   "same without it). --record always keeps it; a sweep never does")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_simulate)

"""``kvscope bench``: kvscope vs transformers' static batching, side by side, one process."""

from __future__ import annotations

import argparse
import json
import sys

from bench.workloads import WORKLOADS


def add_bench_subcommands(sub) -> None:
    p = sub.add_parser("bench", help="benchmark kvscope against transformers' static batching (CPU)",
                       description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--quick", action="store_true",
                   help="smaller workloads (a few minutes on 2 cores instead of ~15-25)")
    p.add_argument("--max-num-seqs", type=int, default=16,
                   help="kvscope's max_num_seqs; also the baseline's static batch size")
    p.add_argument("--num-kv-blocks", type=int, default=512,
                   help="kvscope KV pool in blocks of 16 tokens (512 = 8192 slots, 360 MiB for SmolLM2)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the engine's choice, every usable core; engine/cpu_threads.py)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip transformers (kvscope figures only)")
    p.add_argument("--no-events-cost", dest="events_cost", action="store_false")
    p.add_argument("--no-roofline", dest="roofline", action="store_false",
                   help="skip the roofline rows (GEMM and bandwidth ceilings, 64/16/1-sequence decode, prefill)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="bench/results_cpu.json", help="where to write the JSON results")
    p.add_argument("--results", default="bench/RESULTS.md",
                   help="markdown file whose CPU section is replaced ('' to skip)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--update-readme", action="store_true",
                   help="only rewrite README.md's benchmark paragraph from the --json file "
                        "(no benchmark run)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from bench.readme_block import update_readme

    if args.update_readme:
        changed = update_readme(json_path=args.json)
        print("README.md benchmark paragraph " + ("rewritten" if changed else "already current"))
        return 0
    from bench import workloads as W
    from bench.report import render_markdown, update_results_md, write_json
    from bench.roofline import FULL_ROOFLINE, QUICK_ROOFLINE
    from bench.suite import BenchOptions, default_threads_env, run_bench

    names = tuple(n.strip() for n in args.workloads.split(",") if n.strip())
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        print(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    default_threads_env(args.threads)
    opts = BenchOptions(model=args.model, workloads=names, scale=W.QUICK if args.quick else W.FULL,
                        scale_name="quick" if args.quick else "full", max_num_seqs=args.max_num_seqs,
                        num_kv_blocks=args.num_kv_blocks, baseline=args.baseline,
                        events_cost=args.events_cost,
                        roofline=(QUICK_ROOFLINE if args.quick else FULL_ROOFLINE) if args.roofline else None,
                        seed=args.seed, progress=args.progress)
    results = run_bench(opts)
    md = render_markdown(results)
    if args.json:
        write_json(results, args.json)
    if args.results:
        update_results_md(md, args.results)
        if not args.quick and args.json:  # the README quotes the full run only
            update_readme(json_path=args.json)
    print(md)
    failed = [t["target"] for t in results["targets"] if t["met"] is False]
    if failed:
        print("targets not met: " + "; ".join(failed), file=sys.stderr)
    print(json.dumps({"json": args.json, "results": args.results}), file=sys.stderr)
    return 0

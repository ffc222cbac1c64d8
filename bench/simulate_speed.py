"""How fast ``kvscope simulate`` runs a fleet-scale trace (issue 30's speed goal).

    python -m engine.simulate.mooncake --reuse 0.37 --out /tmp/mc12k.jsonl
    python -m bench.simulate_speed /tmp/mc12k.jsonl --requests 1200            # a slice, 1 pod
    python -m bench.simulate_speed /tmp/mc12k.jsonl --pods 8 --router precise-prefix
    python -m bench.simulate_speed /tmp/mc12k.jsonl --profile 30               # cProfile, top 30
    python -m bench.simulate_speed /tmp/mc12k.jsonl --sweep                    # 8 sizes x 4 routers

Prints one JSON line per run: wall seconds (the simulation only, not reading the trace),
the process's CPU seconds (steadier than wall time on a shared box; with its children: the prompt feed), the seconds spent in
the garbage collector, requests/s, steps/s, prompt tokens/s, and what the core did (blocks stored and evicted,
preemptions, hit rate, and ``miss_tokens``: the miss causes' tokens, cold, evicted and partial, ``null`` without
the book), so a faster version can be checked to do the same work. The machine's load
(``os.getloadavg``) at the start and the end goes with each line: this box's 2 cores are shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

from engine.core import CacheConfig, SchedulerConfig
from engine.simulate.cost import default_cost
from engine.simulate.report import summarize
from engine.simulate.simulation import SharedPrompts, SimConfig, simulate
from engine.simulate.sweep import map_runs
from engine.simulate.trace import Trace, read_jsonl

SWEEP_BLOCKS = (15_000, 30_000, 45_000, 60_000, 90_000, 120_000, 180_000, 240_000)
SWEEP_ROUTERS = ("round-robin", "least-loaded", "precise-prefix", "oracle")


def config(args: argparse.Namespace, pods: int, router: str, blocks: int) -> SimConfig:
    sched = SchedulerConfig(max_model_len=args.max_model_len, max_num_batched_tokens=args.batched,
                            max_num_seqs=args.max_num_seqs)
    return SimConfig(pods, router, sched, CacheConfig(block_size=args.block_size, num_blocks=blocks),
                     default_cost())


def run_one(trace: Trace, cfg: SimConfig, shared: SharedPrompts | None = None,
            prompt_process: bool | None = None) -> dict:
    load0 = os.getloadavg()[0]
    gc_s = [0.0, 0.0]  # time in the garbage collector, and when the running one started

    def gc_timer(phase, info):
        if phase == "start":
            gc_s[1] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_s[1]

    gc.callbacks.append(gc_timer)
    c0, cc0, t0 = time.process_time(), _cpu_with_children(), time.perf_counter()
    try:
        res = simulate(trace, cfg, shared=shared, prompt_process=prompt_process)
    finally:
        gc.callbacks.remove(gc_timer)
    wall, cpu, cpu_all = time.perf_counter() - t0, time.process_time() - c0, _cpu_with_children() - cc0
    s = summarize(res)
    steps = sum(p.num_steps for p in res.pods)
    prompt = sum(r.num_prompt_tokens for r in trace.requests)
    return {"pods": cfg.num_pods, "router": cfg.router, "num_kv_blocks": cfg.cache.num_blocks,
            "requests": len(trace.requests), "prompt_tokens": prompt, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "cpu_with_children_s": round(cpu_all, 2), "gc_s": round(gc_s[0], 2),
            "requests_per_s": round(len(trace.requests) / wall, 1), "steps": steps,
            "steps_per_s": round(steps / wall, 1), "prompt_tokens_per_s": round(prompt / wall),
            "num_blocks_stored": sum(p.num_blocks_stored for p in res.pods),
            "num_blocks_evicted": s["num_blocks_evicted"], "num_preemptions": s["num_preemptions"],
            "miss_causes": cfg.miss_causes, "max_rss_mib": round(_max_rss_mib()),
            "prefix_cache_hit_rate": s["prefix_cache_hit_rate"], "reachable_hit_rate": s["reachable_hit_rate"],
            "miss_tokens": [s[f"prefix_cache_miss_{c}"] for c in ("cold", "evicted", "partial")],
            "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2)}


def _cpu_with_children() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _max_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--requests", type=int, default=0, help="the first N requests only (0: all)")
    p.add_argument("--pods", type=int, default=1)
    p.add_argument("--router", default="round-robin")
    p.add_argument("--num-kv-blocks", type=int, default=60_000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--batched", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=200_000)
    p.add_argument("--profile", type=int, default=0, help="cProfile the run, print the top N")
    p.add_argument("--sweep", action="store_true", help=f"{len(SWEEP_BLOCKS)} pool sizes x "
                   f"{len(SWEEP_ROUTERS)} routers on --pods pods")
    p.add_argument("--workers", type=int, default=1, help="--sweep: processes running its runs")
    p.add_argument("--prompt-process", choices=("auto", "on", "off"), default="auto",
                   help="make the prompts' hashes in a second process (PromptFeed): "
                   "auto as kvscope simulate (a large trace, a second core)")
    p.add_argument("--miss-causes", action="store_true", help="one run with the miss-cause book, "
                   "as kvscope simulate --miss-causes (a sweep never keeps one)")
    a = p.parse_args(argv)
    trace = read_jsonl(__import__("pathlib").Path(a.trace))
    if a.requests:
        trace = dataclasses.replace(trace, requests=trace.requests[:a.requests])
    if a.sweep:  # as run_sweep runs it: no miss causes, prompts made once, --workers
        t0, c0, load0 = time.perf_counter(), _cpu_with_children(), os.getloadavg()[0]
        cfgs = [dataclasses.replace(config(a, a.pods, router, blocks), miss_causes=False)
                for blocks in SWEEP_BLOCKS for router in SWEEP_ROUTERS]
        for row in map_runs(run_one, trace, cfgs, a.workers):
            print(json.dumps(row), flush=True)
        print(json.dumps({"sweep_wall_s": round(time.perf_counter() - t0, 1), "runs": len(cfgs),
                          "workers": a.workers, "sweep_cpu_s": round(_cpu_with_children() - c0, 1),
                          "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2)}))
        return 0
    cfg = dataclasses.replace(config(a, a.pods, a.router, a.num_kv_blocks), miss_causes=a.miss_causes)
    feed = {"auto": None, "on": True, "off": False}[a.prompt_process]
    if a.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        out = run_one(trace, cfg, prompt_process=feed)
        prof.disable()
        print(json.dumps(out))
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(a.profile)
        return 0
    print(json.dumps(run_one(trace, cfg, prompt_process=feed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

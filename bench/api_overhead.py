"""What serving costs: 16 concurrent streaming OpenAI-API clients against LLM.generate.

The same 16 requests (the quick ``mixed`` workload: chat prompts as token ids, each
producing exactly its drawn number of tokens, greedy) run two ways, on ONE engine:
- offline: ``LLM.generate`` on all of them at once;
- served: a ``KVScopeServer`` (as ``kvscope serve`` runs it: recording on, /metrics
  fed) whose engine factory hands it that same engine, and a client process with 16
  concurrent ``openai.AsyncOpenAI`` streams to ``/v1/completions`` (token-id prompts,
  so both ways see identical inputs), all sent at t0.
One engine for both, because two engines' KV pools land in different memory and
differ by several percent on their own (see events_cost.py); the prefix cache is
reset before every run. The two alternate for ``--rounds`` rounds, so other jobs'
load on a shared box falls on both; the figure is the ratio of the medians of
output tokens per second (first request sent to last token received). The same
ratio from the server process's CPU seconds is given too (other jobs cannot stretch
it; the client process's CPU is not charged to the server). Greedy tokens must be
identical both ways.

    python -m bench.api_overhead [--model smollm2-135m] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONCURRENCY = 16
GOAL = 0.9


# ---- the client process --------------------------------------------------------------

async def _clients(base_url: str, model: str, requests: list[dict]) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(r: dict) -> tuple[list[int], float]:
        async with gate:
            ids, first = [], None
            stream = await client.completions.create(
                model=model, prompt=r["prompt_ids"], max_tokens=r["max_tokens"], temperature=0,
                stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].token_ids:
                    first = first or time.perf_counter()
                    ids.extend(chunk.choices[0].token_ids)
            return ids, first

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in requests))
    wall = time.perf_counter() - t0
    await client.close()
    return {"wall_s": wall, "token_ids": [ids for ids, _ in results],
            "ttft_s": [f - t0 for _, f in results if f is not None],
            "client_cpu_s": time.process_time()}


def client_main(base_url: str, model: str, spec: str) -> None:
    requests = json.loads(Path(spec).read_text())
    print(json.dumps(asyncio.run(_clients(base_url, model, requests))))


# ---- the parent: offline runs, the server, the comparison ------------------------------------

def _offline(llm, workload) -> dict:
    from engine import SamplingParams

    llm.reset_prefix_cache()
    params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
              for r in workload.requests]
    cpu0, t0 = time.process_time(), time.perf_counter()
    outs = llm.generate([list(r.prompt_ids) for r in workload.requests], params)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
            "token_ids": [o.outputs[0].token_ids for o in outs]}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by thread name (unnamed ones summed
    as "other"), so a served run's cost splits into engine, HTTP loop and recorder."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "other")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def _served(llm, workload, spec: Path, db: str) -> dict:
    import urllib.request

    from engine.server.app import KVScopeServer, ServerOptions

    engine = llm.engine
    server = KVScopeServer(ServerOptions(engine.config, port=0, db=db, label="bench api overhead",
                                         engine_factory=lambda cfg: engine)).start()
    try:
        server.wait_ready(120)
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{server.port}/reset_prefix_cache", method="POST"), timeout=30).read()
        cpu0, threads0 = time.process_time(), _thread_cpu()
        out = subprocess.run([sys.executable, "-m", "bench.api_overhead", "--client", server.http_url,
                              "--served-model", server.options.model_name, "--spec", str(spec)],
                             capture_output=True, text=True, check=True, timeout=3600,
                             cwd=Path(__file__).resolve().parents[1])
        cpu, threads = time.process_time() - cpu0, _delta(_thread_cpu(), threads0)
    finally:
        server.stop()
        engine.step_listeners.clear()  # the server's listeners; the next offline run has none
    res = json.loads(out.stdout)
    res["cpu_s"], res["thread_cpu_s"] = cpu, threads
    return res


def run(model: str, rounds: int, scale=None, engine: dict | None = None) -> dict:
    """Both ways for ``rounds`` rounds; ``scale`` (default QUICK) sizes the mixed workload,
    ``engine`` overrides engine options (the smoke test's tiny model)."""
    import torch

    from bench.measure import loadavg, machine_info
    from bench.run_kvscope import BASE_ENGINE
    from bench.workloads import QUICK, mixed
    from engine import LLM

    torch.set_num_threads(1)
    llm = LLM(model, **{**BASE_ENGINE, "max_num_seqs": CONCURRENCY, "num_kv_blocks": 512,
                        **(engine or {})})
    workload = mixed(llm.get_tokenizer(), scale or QUICK)
    tokens = workload.num_output_tokens
    load0 = loadavg()
    runs: dict[str, list[dict]] = {"offline": [], "served": []}
    with tempfile.TemporaryDirectory(prefix="kvscope-api-bench-") as tmp:
        spec = Path(tmp) / "requests.json"
        spec.write_text(json.dumps([{"prompt_ids": list(r.prompt_ids), "max_tokens": r.max_tokens}
                                    for r in workload.requests]))
        _offline(llm, workload)  # warm-up: first-touch of weights and pool
        for i in range(rounds):
            order = ("offline", "served") if i % 2 == 0 else ("served", "offline")
            for mode in order:
                r = _offline(llm, workload) if mode == "offline" else \
                    _served(llm, workload, spec, str(Path(tmp) / "runs.sqlite"))
                r["tok_s"], r["tok_per_cpu_s"] = tokens / r["wall_s"], tokens / r["cpu_s"]
                runs[mode].append(r)
                print(f"round {i} {mode}: {r['tok_s']:.1f} tok/s, {r['tok_per_cpu_s']:.1f} tok/cpu-s",
                      file=sys.stderr)
    ref = runs["offline"][0]["token_ids"]
    same = all(r["token_ids"] == ref for mode in runs for r in runs[mode])
    med = {m: statistics.median(r["tok_s"] for r in rs) for m, rs in runs.items()}
    med_cpu = {m: statistics.median(r["tok_per_cpu_s"] for r in rs) for m, rs in runs.items()}
    for rs in runs.values():
        for r in rs:
            r.pop("token_ids")
    return {"model": llm.engine.model_name, "machine": machine_info(), "load_start": load0,
            "load_end": loadavg(), "workload": workload.description, "requests": len(workload.requests),
            "output_tokens": tokens, "concurrency": CONCURRENCY, "rounds": rounds, "runs": runs,
            "median_tok_s": med, "median_tok_per_cpu_s": med_cpu,
            "ratio_wall": med["served"] / med["offline"], "ratio_cpu": med_cpu["served"] / med_cpu["offline"],
            "goal": GOAL, "tokens_identical": same}


def render(res: dict) -> str:
    m, c = res["median_tok_s"], res["median_tok_per_cpu_s"]
    lines = [
        f"Model {res['model']}, {res['requests']} requests ({res['output_tokens']} output tokens), "
        f"{res['concurrency']} concurrent streams, {res['rounds']} rounds alternating. "
        f"Load average at start {res['load_start']}, at end {res['load_end']}.",
        "",
        "| target | goal | value (wall clock) | met | value from CPU time | met |",
        "|---|---|---|---|---|---|",
        f"| 16 streaming API clients: throughput served / LLM.generate | >= {res['goal']} | "
        f"{res['ratio_wall']:.2f}x | {'yes' if res['ratio_wall'] >= res['goal'] else 'no'} | "
        f"{res['ratio_cpu']:.2f}x | {'yes' if res['ratio_cpu'] >= res['goal'] else 'no'} |",
        "",
        "| way | output tokens/s (median) | output tokens per CPU-second (median) | runs (tokens/s) |",
        "|---|---|---|---|",
    ]
    for mode in ("offline", "served"):
        runs = ", ".join(f"{r['tok_s']:.1f}" for r in res["runs"][mode])
        name = "LLM.generate" if mode == "offline" else "kvscope serve + 16 openai streams"
        lines.append(f"| {name} | {m[mode]:.1f} | {c[mode]:.1f} | {runs} |")
    lines += ["", "Greedy tokens identical in every run: " + ("yes" if res["tokens_identical"] else "NO")]
    served = [r for r in res["runs"]["served"] if "thread_cpu_s" in r]
    if served:  # where the served runs' CPU went, per thread of the server process
        names = sorted({k for r in served for k in r["thread_cpu_s"]})
        lines += ["", "| served run | " + " | ".join(f"{n} CPU-s" for n in names) + " | offline run CPU-s |",
                  "|---" * (len(names) + 2) + "|"]
        for i, (r, o) in enumerate(zip(served, res["runs"]["offline"])):
            lines.append(f"| {i} | " + " | ".join(f"{r['thread_cpu_s'].get(n, 0):.2f}" for n in names)
                         + f" | {o['cpu_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the client process
    p.add_argument("--served-model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        client_main(args.client, args.served_model, args.spec)
        return 0
    res = run(args.model, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(render(res))
    return 0 if res["tokens_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())

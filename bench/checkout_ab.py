"""Two checkouts of kvscope, A and B, on one workload, one fresh process per run, alternating.

    python -m bench.checkout_ab /path/to/A /path/to/B --concurrency 1 16 64

Each run is ``python bench/checkout_ab.py --child ...`` with ``PYTHONPATH`` and the working
directory set to one checkout, so it imports that checkout's engine and kernels (each
checkout builds its C++ kernels into a directory of its own under ``--ext-dir``: the two
builds never replace each other). The child loads the default model, warms the engine up
(a few short requests, so both checkouts pack their weights before the clock starts),
then queues ``requests`` prompts of ``prompt_len`` random tokens with ``max_tokens`` output
tokens (greedy, ignore_eos) at once into an engine with ``max_num_seqs = concurrency`` and
steps it until it drains, as issue 33's served comparison does, without the servers. It
prints one JSON line: wall seconds, the process's CPU seconds, output tokens/s, the median
decode-only step (wall and CPU ms), and the output token ids' digest.

Runs alternate A B B A per concurrency (``--pairs`` such pairs), so the box's load drifts
over both alike; the load average is recorded around every run. The ratio reported is
B / A of the medians. ``--overrides-a`` / ``--overrides-b`` give each side's engine settings
(JSON), so the same checkout given twice A/Bs a setting (e.g. max_num_batched_tokens).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(concurrency: int, requests: int, prompt_len: int, max_tokens: int, threads: int,
          overrides: dict | None = None) -> dict:
    import random

    import torch

    from bench.run_kvscope import make_engine
    from engine import SamplingParams
    from engine.model.loader import load_model

    torch.set_num_threads(threads)
    # the weights' format is the load's: an override of it must reach the load, not only the config
    loaded = load_model("smollm2-135m", **{k: v for k, v in (overrides or {}).items() if k in ("dtype", "quantization")})
    vocab = loaded.spec.vocab_size
    engine = make_engine(loaded, "smollm2-135m", concurrency, 64 * concurrency + 64,
                         **{"block_size": 32, "max_model_len": prompt_len + max_tokens + 64, **(overrides or {})})
    rng = random.Random(1234)
    for i in range(8):  # warm-up: prefill and multi-row decode steps pack every weight
        engine.add_request([rng.randrange(100, vocab - 100) for _ in range(40)],
                           SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), request_id=f"warm{i}")
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(requests):
        engine.add_request([rng.randrange(100, vocab - 100) for _ in range(prompt_len)],
                           SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), request_id=f"r{i}")
    sched = engine.engine_core.scheduler
    decode_steps: list[tuple[float, float]] = []
    tokens: dict[str, list[int]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        decode_only = not sched.waiting and all(
            r.num_computed_tokens >= r.num_prompt_tokens for r in sched.requests.values())
        t, c = time.perf_counter(), time.process_time()
        for out in engine.step():
            tokens[out.request_id] = list(out.outputs[0].token_ids)
        if decode_only:
            decode_steps.append((time.perf_counter() - t, time.process_time() - c))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    digest = hashlib.sha256(json.dumps(sorted(tokens.items())).encode()).hexdigest()[:16]
    return {"wall_s": wall, "cpu_s": cpu, "out_tok_s": requests * max_tokens / wall,
            "decode_steps": len(decode_steps),
            "decode_step_ms": 1e3 * statistics.median(w for w, _ in decode_steps) if decode_steps else None,
            "decode_step_cpu_ms": 1e3 * statistics.median(c for _, c in decode_steps) if decode_steps else None,
            "tokens_digest": digest}


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


def run_one(checkout: Path, ext_dir: Path, args, concurrency: int, requests: int, overrides: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "TORCH_EXTENSIONS_DIR": str(ext_dir),
           "KVSCOPE_ADAPT_THREADS": "0"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--concurrency", str(concurrency),
           "--requests", str(requests), "--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens),
           "--threads", str(args.threads), "--overrides-a", overrides]
    load0 = _load()
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode:
        raise RuntimeError(f"{checkout}: child failed:\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["load_before"], res["load_after"] = load0, _load()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", nargs="?", type=Path)
    p.add_argument("b", nargs="?", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--requests", type=int, nargs="+", default=None,
                   help="requests per concurrency (default: 8 at concurrency 1, else 2 x concurrency, at least 32)")
    p.add_argument("--prompt-len", type=int, default=210)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=2, help="A B B A: two pairs")
    p.add_argument("--ext-dir", type=Path, default=Path("/tmp/kvscope-checkout-ab"))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--overrides-a", default="{}", help="EngineConfig fields for A's engines, as JSON")
    p.add_argument("--overrides-b", default="{}", help="the same for B (the same checkout twice: a config A/B)")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.concurrency[0], args.requests[0], args.prompt_len, args.max_tokens, args.threads,
                               json.loads(args.overrides_a))))
        return
    if args.a is None or args.b is None:
        p.error("give the two checkouts, A and B")
    requests = args.requests or [8 if c == 1 else max(32, 2 * c) for c in args.concurrency]
    if len(requests) != len(args.concurrency):
        p.error("--requests needs one count per --concurrency")
    runs = []
    for c, n in zip(args.concurrency, requests):
        for k in range(2 * args.pairs):
            which = "AB"[(k + k // 2) % 2]  # A B B A
            checkout = args.a if which == "A" else args.b
            r = run_one(checkout, args.ext_dir / which, args, c, n, args.overrides_a if which == "A" else args.overrides_b)
            r.update(which=which, concurrency=c, requests=n)
            runs.append(r)
            print(f"c={c} {which}: {r['out_tok_s']:.1f} out tok/s, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, "
                  f"decode step {r['decode_step_ms'] or float('nan'):.1f} ms (CPU {r['decode_step_cpu_ms'] or float('nan'):.1f}) over {r['decode_steps']}, "
                  f"tokens {r['tokens_digest']}, load {r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}",
                  flush=True)
    for c in args.concurrency:
        got = {w: [r for r in runs if r["concurrency"] == c and r["which"] == w] for w in "AB"}

        def med(w, key):
            vals = [r[key] for r in got[w] if r[key] is not None]
            return statistics.median(vals) if vals else float("nan")

        same = len({r["tokens_digest"] for r in got["A"] + got["B"]}) == 1
        print(f"c={c}: B/A out tok/s {med('B', 'out_tok_s') / med('A', 'out_tok_s'):.3f}, "
              f"CPU s {med('B', 'cpu_s') / med('A', 'cpu_s'):.3f}, decode step wall "
              f"{med('B', 'decode_step_ms') / med('A', 'decode_step_ms'):.3f}, CPU "
              f"{med('B', 'decode_step_cpu_ms') / med('A', 'decode_step_cpu_ms'):.3f}; tokens identical: {same}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()

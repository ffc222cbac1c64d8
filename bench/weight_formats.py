"""float32 vs the optional reduced-precision CPU weights: speed and accuracy, one process.

    python -m bench.weight_formats [--formats float32,bfloat16,int8] [--quick] [--json PATH]
                                   [--kv-cache-dtype bfloat16]

For each format (float32; ``dtype="bfloat16"``, whose GEMMs run in bf16 on AVX512-BF16/AMX
from 2 rows; ``quantization="int8"``, float32 compute; ``quantization="w8a8"``, inputs
rounded to int8 too) on smollm2-135m:

- speed: the roofline units of ``kvscope bench`` (bench/roofline.py), 1/16/64-sequence
  decode and a 512-token prefill, with the ceilings measured once for all formats;
- accuracy against float32: the last-position logits of every prompt of the bench's
  ``mixed`` workload (max |difference|, and as a share of float32's logit range; top-1
  agreement), and greedy generation of that workload with each request's drawn output
  length (requests whose tokens equal float32's, tokens before the first divergence).
  ``--kv-cache-dtype bfloat16`` gives every format but the float32 reference a bf16 KV
  cache (and so bf16 prefill attention: kernels/torch_paged.py), as vLLM's bf16 runs.

The formats run one after the other (load average printed before and after each);
compare them on a quiet box.
"""

from __future__ import annotations

import argparse
import json

from engine.core.config import KV_CACHE_DTYPES

MODEL = "smollm2-135m"


def _load(fmt: str):
    from engine.core.config import QUANTIZATIONS
    from engine.model.loader import load_model

    if fmt in QUANTIZATIONS:
        return load_model(MODEL, quantization=fmt)
    return load_model(MODEL, dtype=fmt)


def _prompt_logits(loaded, prompts, **overrides) -> list:
    """Last-position logits of each prompt, one prompt per engine step."""
    from bench.run_kvscope import make_engine
    from engine import SamplingParams

    rows = []
    model = loaded.model
    inner = model.compute_logits

    def capture(hidden):
        logits = inner(hidden)
        rows.append(logits[0].clone())
        return logits

    model.compute_logits = capture  # an instance attribute over the method, removed below
    try:
        engine = make_engine(loaded, MODEL, 1, 64, enable_prefix_caching=False, max_model_len=1024, **overrides)
        for ids in prompts:
            engine.add_request(list(ids), SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
            while engine.has_unfinished_requests():
                engine.step()
    finally:
        del model.compute_logits
    return rows


def run(formats: list[str], quick: bool, speed: bool = True, accuracy: bool = True,
        kv_cache_dtype: str = "auto") -> dict:
    from bench import workloads as W
    from bench.measure import compare_tokens, loadavg
    from bench.roofline import FULL_ROOFLINE, QUICK_ROOFLINE, run_roofline
    from bench.run_kvscope import make_engine, run_kvscope

    out: dict = {"formats": {}}
    ref_logits = ref_tokens = None
    for fmt in formats:
        load0 = loadavg()
        loaded = _load(fmt)
        entry: dict = {}
        if speed:
            entry["roofline"] = run_roofline(loaded, MODEL, QUICK_ROOFLINE if quick else FULL_ROOFLINE)
        entry["loadavg"] = [load0, loadavg()]
        if not accuracy:
            out["formats"][fmt] = entry
            del loaded
            continue
        wl = W.build("mixed", loaded.tokenizer, W.QUICK, 0)
        kv = {"kv_cache_dtype": kv_cache_dtype if ref_logits is not None else "auto"}  # the reference: float32
        logits = _prompt_logits(loaded, [r.prompt_ids for r in wl.requests], **kv)
        engine = make_engine(loaded, MODEL, 16, 512, **kv)
        tokens = run_kvscope(engine, wl).token_ids
        del engine
        if ref_logits is None:
            ref_logits, ref_tokens = logits, tokens
        else:
            diffs = [(a - b).abs().max().item() for a, b in zip(ref_logits, logits)]
            ranges = [(a.max() - a.min()).item() for a in ref_logits]
            entry["accuracy"] = {
                "prompts": len(logits),
                "max_abs_logit_error": max(diffs),
                "max_logit_error_share_of_range": max(d / r for d, r in zip(diffs, ranges)),
                "top1_agreement": sum(int(a.argmax() == b.argmax()) for a, b in zip(ref_logits, logits)),
                "greedy": compare_tokens(ref_tokens, tokens),
            }
        out["formats"][fmt] = entry
        print(f"{fmt}: {json.dumps({k: v for k, v in entry.items() if k != 'roofline'})}", flush=True)
        del loaded
    return out


def render(res: dict) -> str:
    lines = ["| weights | MB streamed per step | 1-seq decode tok/s (share of its bandwidth limit) | "
             "16-seq decode tok/s | 64-seq decode tok/s | 512-token prefill s | greedy = float32 | "
             "max logit error (share of range) | top-1 = float32 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fmt, e in res["formats"].items():
        if "roofline" not in e:
            continue
        u, m = e["roofline"]["units"], e["roofline"]["model"]
        acc = e.get("accuracy")
        g = acc["greedy"] if acc else None
        lines.append(
            f"| {fmt} | {m['weight_bytes'] / 1e6:.0f} | {u['decode_1']['tokens_per_s']:.1f} "
            f"({100 * u['decode_1']['bytes_fraction']:.0f}%) | {u['decode_16']['tokens_per_s']:.1f} | "
            f"{u['decode_64']['tokens_per_s']:.1f} | {u['prefill_512']['median_step_s']:.2f} | "
            + (f"{g['identical_requests']}/{g['requests']} requests, {g['tokens_before_divergence']}/"
               f"{g['tokens']} tokens | {acc['max_abs_logit_error']:.3f} "
               f"({100 * acc['max_logit_error_share_of_range']:.2f}%) | {acc['top1_agreement']}/"
               f"{acc['prompts']} |" if acc else ("reference | – | – |" if fmt == "float32" else "– | – | – |")))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="float32,bfloat16,int8,w8a8")
    p.add_argument("--quick", action="store_true", help="fewer timed steps per roofline unit")
    p.add_argument("--no-speed", dest="speed", action="store_false", help="accuracy only")
    p.add_argument("--no-accuracy", dest="accuracy", action="store_false", help="speed only")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the KV cache of every format but the float32 reference (accuracy runs)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if formats[0] != "float32":
        p.error("the first format is the reference and must be float32")
    res = run(formats, args.quick, args.speed, args.accuracy, args.kv_cache_dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print(render(res))


if __name__ == "__main__":
    main()

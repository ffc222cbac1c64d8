"""The roofline rows of ``kvscope bench``: each CPU workload against the machine's limits.

Two ceilings, measured in the same run at the torch thread count in use:

- GEMM rate: ``torch.mm`` of two 2048 x 2048 float32 matrices (2 * 2048^3 FLOPs), best
  of several calls.
- Memory read bandwidth: ``sum()`` over a 256 MiB float32 tensor (far larger than the
  last-level cache), best of several calls.

And four units of engine work (bench/cpu_units.py): 64, 16 and 1 sequences decoding
(64-token prompts), and one 512-token prefill. For each, the work comes from the
model's shapes, not from a constant:

- FLOPs: 2 per weight of every linear layer and token that goes through it (the
  lm_head only for the rows that are sampled: every decode token, one row of a
  prefill), plus attention, 4 * heads * head_dim * context per token and layer (QK^T
  and PV; causal for a prefill).
- Bytes: every linear weight once per step, as stored (float32 here: 4 bytes per
  weight; the "fp32 weight-streaming limit"), plus the K/V the step reads.

The lower bound on a step's time is max(FLOPs / GEMM rate, bytes / bandwidth); a unit's
fraction of its ceiling is that bound over the measured median step time. Batch-64
decode is FLOP-bound (the issue's goal: >= 65% of the FLOP ceiling); batch-1 decode
is bandwidth-bound (goal: >= 70% of the weight-streaming limit).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

GEMM_N = 2048
BANDWIDTH_BYTES = 256 << 20
GOALS = {"decode_64": ("flops", 0.65), "decode_1": ("bytes", 0.70)}  # unit: (ceiling, at least)


@dataclass(frozen=True, slots=True)
class Ceilings:
    """The machine's limits at ``threads`` torch threads. The ``_cpu`` twins divide the
    work by the CPU seconds per thread instead of wall seconds: other jobs' load
    stretches wall time but hardly the CPU time (it still shares memory bandwidth)."""

    threads: int
    gemm_gflops: float
    read_gbps: float
    gemm_gflops_cpu: float
    read_gbps_cpu: float


def _best_seconds(fn, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """(best wall seconds, best process CPU seconds per torch thread) of ``fn()``."""
    import torch

    for _ in range(warmup):
        fn()
    wall = cpu = float("inf")
    threads = torch.get_num_threads()
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t)
        cpu = min(cpu, (time.process_time() - c) / threads)
    return wall, cpu


def measure_ceilings(repeats: int = 5) -> Ceilings:
    """GEMM GFLOP/s and read GB/s at the current torch thread count (best of ``repeats``)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_N, GEMM_N, generator=gen)
    b = torch.randn(GEMM_N, GEMM_N, generator=gen)
    c = torch.empty(GEMM_N, GEMM_N)
    gemm_s, gemm_cpu = _best_seconds(lambda: torch.mm(a, b, out=c), repeats)
    del a, b, c
    x = torch.ones(BANDWIDTH_BYTES // 4)
    read_s, read_cpu = _best_seconds(lambda: x.sum(), repeats)
    del x
    flops = 2 * GEMM_N**3
    return Ceilings(torch.get_num_threads(), flops / gemm_s / 1e9, BANDWIDTH_BYTES / read_s / 1e9,
                    flops / gemm_cpu / 1e9, BANDWIDTH_BYTES / read_cpu / 1e9)


@dataclass(frozen=True, slots=True)
class ModelCosts:
    """Per-token work of one model, from its shapes; written once by ``model_costs``."""

    linear_weights: int  # weights of every linear layer except the lm_head
    lm_head_weights: int  # vocab x hidden (tied or not)
    weight_bytes: int  # bytes one step reads to stream every linear weight and the lm_head
    attn_flops_per_ctx: int  # attention FLOPs per query token per context position, all layers
    kv_bytes_per_ctx: int  # K/V bytes per context position, all layers

    @property
    def decode_flops_per_token(self) -> int:
        """Linear + lm_head FLOPs of one decoded token (attention excluded)."""
        return 2 * (self.linear_weights + self.lm_head_weights)


def model_costs(loaded) -> ModelCosts:
    """The costs of ``loaded``'s model (a CausalLM of engine.model)."""
    import torch

    from engine.model.layers import Linear

    model, spec = loaded.model, loaded.spec
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    head = model.lm_head if getattr(model, "lm_head", None) is not None else model.embed_tokens
    reduced_head = getattr(model, "logits_reduced", None)
    head_weights = model.embed_tokens.numel()  # vocab x hidden, tied or not
    head_bytes = reduced_head.nbytes if reduced_head is not None else head.numel() * head.element_size()
    item = torch.empty((), dtype=loaded.dtype).element_size()
    return ModelCosts(
        linear_weights=sum(m.num_weights for m in linears),
        lm_head_weights=head_weights,
        weight_bytes=sum(m.weight_bytes for m in linears) + head_bytes,
        attn_flops_per_ctx=4 * spec.num_heads * spec.head_dim * spec.num_layers,
        kv_bytes_per_ctx=2 * spec.num_kv_heads * spec.head_dim * spec.num_layers * item,
    )


def decode_step_work(costs: ModelCosts, batch: int, context: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step of ``batch`` sequences at ``context`` positions."""
    flops = batch * (costs.decode_flops_per_token + costs.attn_flops_per_ctx * context)
    return flops, costs.weight_bytes + batch * context * costs.kv_bytes_per_ctx


def prefill_work(costs: ModelCosts, tokens: int) -> tuple[float, float]:
    """(FLOPs, bytes) of prefilling one ``tokens``-long prompt in one step (causal)."""
    flops = (2 * costs.linear_weights * tokens + 2 * costs.lm_head_weights
             + costs.attn_flops_per_ctx * tokens * (tokens + 1) / 2)
    return flops, costs.weight_bytes + tokens * costs.kv_bytes_per_ctx


def against_ceilings(flops: float, nbytes: float, step_s: float, ceil: Ceilings,
                     cpu_time: bool = False) -> dict:
    """Achieved rates and fractions of both ceilings for one step of ``step_s`` seconds
    (CPU seconds per thread, against the CPU-time ceilings, with ``cpu_time``)."""
    gemm, read = (ceil.gemm_gflops_cpu, ceil.read_gbps_cpu) if cpu_time else (ceil.gemm_gflops, ceil.read_gbps)
    t_flops = flops / (gemm * 1e9)
    t_bytes = nbytes / (read * 1e9)
    return {"gflops": flops / step_s / 1e9, "gbps": nbytes / step_s / 1e9,
            "flops_fraction": t_flops / step_s, "bytes_fraction": t_bytes / step_s,
            "bound": "flops" if t_flops >= t_bytes else "bytes",
            "roofline_fraction": max(t_flops, t_bytes) / step_s}


@dataclass(frozen=True, slots=True)
class RooflineScale:
    decode_batches: tuple[int, ...] = (64, 16, 1)
    decode_steps: dict | None = None  # batch -> timed steps
    prompt_len: int = 64
    prefill_tokens: int = 512
    prefill_repeats: int = 3

    def steps(self, batch: int) -> int:
        table = self.decode_steps or {64: 6, 16: 10, 1: 32}
        return table.get(batch, 8)


# Decode steps run before each decode unit's timed ones: the first step of a small batch
# packs every linear weight (layers.PackedWeightCache: MKL's layout, else oneDNN's) and first touches the
# KV pool; measured on the 2-core box, the next one or two were still 1.5-2x slower.
WARMUP_STEPS = 2
FULL_ROOFLINE = RooflineScale()
QUICK_ROOFLINE = RooflineScale(decode_steps={64: 3, 16: 5, 1: 16}, prefill_repeats=2)


def run_roofline(loaded, model: str, scale: RooflineScale = FULL_ROOFLINE, progress=None) -> dict:
    """Ceilings, then every unit of ``scale``; returns the JSON-able roofline section."""
    from bench.cpu_units import DecodeBatch, Prefill, decode_max_tokens, fitting_prompt_len
    from bench.measure import loadavg
    from bench.run_kvscope import make_engine

    costs = model_costs(loaded)
    vocab = loaded.spec.vocab_size
    load0 = loadavg()
    ceil = measure_ceilings()
    units: dict[str, dict] = {}
    for batch in scale.decode_batches:
        steps = scale.steps(batch)
        max_tokens = decode_max_tokens(batch, scale.prompt_len, WARMUP_STEPS + steps)
        max_len = scale.prompt_len + max_tokens + 16
        blocks = batch * -(-max_len // 16) + 8
        engine = make_engine(loaded, model, batch, blocks, enable_prefix_caching=False,
                             max_model_len=max_len)
        unit = DecodeBatch(engine, vocab, batch, scale.prompt_len, max_tokens=max_tokens)
        unit.run(WARMUP_STEPS)  # not timed: the first small-batch step packs every weight
        timing = unit.run(steps)
        ctx = statistics.mean(timing.context_lens)
        flops, nbytes = decode_step_work(costs, batch, ctx)
        units[f"decode_{batch}"] = _unit_row(f"{batch}-sequence decode", timing, flops, nbytes, ceil,
                                             batch=batch, context=ctx)
        del unit, engine
        if progress:
            progress(f"decode_{batch}")
    n_prefill = fitting_prompt_len(loaded, scale.prefill_tokens)
    max_len = n_prefill + 16
    engine = make_engine(loaded, model, 1, -(-max_len // 16) + 8, enable_prefix_caching=False,
                         max_model_len=max_len, max_num_batched_tokens=max(512, n_prefill))
    unit = Prefill(engine, vocab, n_prefill)
    unit.run()  # not timed, as the decode units' warm-up steps
    timing = unit.run()
    for _ in range(scale.prefill_repeats - 1):
        more = unit.run()
        timing.wall_s += more.wall_s
        timing.cpu_s += more.cpu_s
        timing.thread_cpu_s += more.thread_cpu_s
    flops, nbytes = prefill_work(costs, n_prefill)
    units[f"prefill_{n_prefill}"] = _unit_row(f"{n_prefill}-token prefill", timing,
                                              flops, nbytes, ceil, tokens=n_prefill)
    del unit, engine
    return {
        "ceilings": asdict(ceil),
        "model": {**asdict(costs), "decode_flops_per_token": costs.decode_flops_per_token,
                  "dtype": str(loaded.dtype).replace("torch.", "")},
        "units": units,
        "goals": {u: {"ceiling": c, "at_least": g} for u, (c, g) in GOALS.items()},
        "loadavg": [load0, loadavg()],
    }


def _unit_row(label: str, timing, flops: float, nbytes: float, ceil: Ceilings, **extra) -> dict:
    step = timing.median_wall_s
    row = {"label": label, **extra, "steps": len(timing.wall_s), "median_step_s": step,
           "tokens_per_s": timing.tokens / len(timing.wall_s) / step,
           "flops_per_step": flops, "bytes_per_step": nbytes,
           **against_ceilings(flops, nbytes, step, ceil)}
    # the same bound over the CPU seconds the process spent per step and thread, against
    # the ceilings measured the same way: robust to other jobs' load, though not to this
    # process's own spin-waits (they count as work)
    cpu_step = statistics.median(timing.cpu_s) / max(1, ceil.threads)
    if cpu_step > 0:
        by_cpu = against_ceilings(flops, nbytes, cpu_step, ceil, cpu_time=True)
        for key in ("flops_fraction", "bytes_fraction", "roofline_fraction"):
            row[f"{key}_cpu_time"] = by_cpu[key]
    row["timing"] = timing.to_dict()
    return row

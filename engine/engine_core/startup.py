"""Core start-up: ``build_engine_core(config)``, the one way to make an EngineCore.

What it does, in order, and how the pool is sized: docs/architecture.md, "Start-up".
Derived values (device, max_model_len, chunk budget, block count) are computed here and
passed on explicitly; the EngineConfig is never written back. Runs where the core runs
(this process, or the core's own: ``engine.engine_core.process``), so it may import torch.
"""

from __future__ import annotations

import logging

import torch

from engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from engine.core import (
    CacheConfig, ConfigError, EventLog, KVCacheTooSmallError, NewRequestData, SamplingParams,
    ScheduledRequest, Scheduler, SchedulerConfig, SchedulerOutput,
)
from engine.engine_core.core import EngineCore
from engine.model.attention import select_backend
from engine.model.layers import prepack_linears
from engine.model.loader import LoadedModel, load_model
from engine.model.model_runner import ModelRunner

logger = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_CHUNK_BUDGET = 512  # tokens per step: big enough to batch, small enough for fair TTFT


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was asked for but no CUDA device is available; use device='cpu'")
    return torch.device(device)


def configure_cpu_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op thread count for CPU inference; returns the count in use.

    The policy (``num_threads``, then ``KVSCOPE_NUM_THREADS``, an exported
    ``OMP_NUM_THREADS``, the per-use default) and its measurements are in
    engine/cpu_threads.py.
    """
    from engine.cpu_threads import thread_count

    try:
        n = thread_count(num_threads)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
    return torch.get_num_threads()


def _profile_cuda_blocks(cfg: EngineConfig, loaded: LoadedModel, per_block: int,
                         sched: SchedulerConfig, block_size: int) -> int:
    """vLLM-style: run the largest step once, then give the KV cache what is left."""
    backend = select_backend(cfg.attention_backend, loaded.device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    probe_blocks = -(-sched.max_num_batched_tokens // block_size)
    runner = ModelRunner(loaded, probe_blocks, block_size, backend)
    n = sched.max_num_batched_tokens
    table = list(range(probe_blocks))
    out = SchedulerOutput(0, [ScheduledRequest("profile", [0] * n, 0, table, list(range(n)), ("profile",),
                                               "prefill")],
                          new_requests=[NewRequestData("profile", SamplingParams(temperature=0.0), 0)])
    runner.execute(out)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del runner
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    budget = kv_budget_bytes(total, free, peak, cfg.gpu_memory_utilization)
    logger.info("CUDA profile: peak %.0f MiB, free %.0f MiB of %.0f MiB; KV budget %.0f MiB at "
                "utilization %.2f", peak / 2**20, free / 2**20, total / 2**20, budget / 2**20,
                cfg.gpu_memory_utilization)
    return budget // per_block


def kv_budget_bytes(total: int, free: int, peak: int, utilization: float) -> int:
    """Bytes for the KV cache: ``utilization`` of the device minus this process's profiled
    peak (weights + the largest step), but never more than is free right now (another
    process on the same GPU, or the CUDA context, already holds the rest)."""
    return max(0, min(int(total * utilization) - peak, free))


def default_cpu_blocks(per_block: int, block_size: int, max_model_len: int, max_num_seqs: int) -> int:
    """The CPU pool when no size is given: the 1 GiB default, but no more than
    ``max_num_seqs`` full-length sequences can use at once (vLLM's "maximum
    concurrency" figure), so a tiny model does not get a pool nothing ever fills."""
    return min(DEFAULT_CPU_KV_BYTES // per_block, max_num_seqs * -(-max_model_len // block_size))


def resolve_kv_cache_dtype(kv_cache_dtype: str, loaded: LoadedModel) -> torch.dtype:
    """The KV cache's torch dtype: "auto" is the model's (as vLLM's); another dtype only on
    the CPU, whose attention reads a bfloat16 cache into float32 (kernels/cpu_attention.cpp,
    kernels/torch_paged.py). CUDA's kernels take the model's dtype only: a ConfigError."""
    if kv_cache_dtype == "auto":
        return loaded.dtype
    dtype = getattr(torch, kv_cache_dtype)  # one of KV_CACHE_DTYPES: "float32" or "bfloat16"
    if dtype != loaded.dtype and loaded.device.type != "cpu":
        raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r} differs from the model's {loaded.dtype}: "
                          "on CUDA the KV cache takes the model's dtype (use auto)")
    return dtype


def build_engine_core(cfg: EngineConfig, loaded: LoadedModel | None = None) -> EngineCore:
    """The core for ``cfg`` (on ``loaded`` weights when given, e.g. for a restart).

    Raises the KVScopeError subclasses (ConfigError, KVCacheTooSmallError) for a
    config that cannot run."""
    device = resolve_device(cfg.device)
    if device.type == "cpu":
        configure_cpu_threads(cfg.num_threads)
    if loaded is None:
        if cfg.quantization is not None and device.type != "cpu":
            raise ConfigError(f"quantization={cfg.quantization!r} is a CPU feature; on CUDA use dtype")
        loaded = load_model(cfg.model, dtype=cfg.dtype, device=device,
                            trust_remote_code=cfg.trust_remote_code, quantization=cfg.quantization)
    spec = loaded.spec
    max_len = cfg.max_model_len or min(spec.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
    if max_len > spec.max_position_embeddings:  # as vLLM: positions past them give garbage
        raise ConfigError(f"max_model_len {max_len} exceeds the model's {spec.max_position_embeddings} "
                          f"positions")
    budget = cfg.max_num_batched_tokens or (
        DEFAULT_CHUNK_BUDGET if cfg.enable_chunked_prefill else max(max_len, DEFAULT_CHUNK_BUDGET))
    sched = SchedulerConfig(max_model_len=max_len, max_num_batched_tokens=budget,
                            max_num_seqs=cfg.max_num_seqs,
                            enable_chunked_prefill=cfg.enable_chunked_prefill,
                            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                            max_waiting=cfg.max_waiting, n_sharing=cfg.n_sharing,
                            policy=cfg.scheduling_policy, fair_ratio=cfg.fair_ratio)
    kv_dtype = resolve_kv_cache_dtype(cfg.kv_cache_dtype, loaded)
    per_block = spec.kv_bytes_per_block(cfg.block_size, kv_dtype)
    if cfg.num_kv_blocks is not None:
        num_blocks, source = cfg.num_kv_blocks, "num_kv_blocks"
    elif cfg.kv_cache_memory is not None:
        num_blocks, source = cfg.kv_cache_memory // per_block, f"kv_cache_memory={cfg.kv_cache_memory}"
    elif device.type == "cuda":
        num_blocks = _profile_cuda_blocks(cfg, loaded, per_block, sched, cfg.block_size)
        source = f"gpu_memory_utilization={cfg.gpu_memory_utilization}"
    else:
        num_blocks = default_cpu_blocks(per_block, cfg.block_size, max_len, cfg.max_num_seqs)
        source = "the CPU default of 1 GiB"
        if num_blocks < DEFAULT_CPU_KV_BYTES // per_block:
            source += f", capped at what max_num_seqs={cfg.max_num_seqs} full-length sequences use"
    if num_blocks < 1:
        raise KVCacheTooSmallError(
            f"{source} leaves room for no KV block (one block of {cfg.block_size} tokens costs "
            f"{per_block} bytes); raise the KV budget")
    cache = CacheConfig(block_size=cfg.block_size, num_blocks=num_blocks,
                        enable_prefix_caching=cfg.enable_prefix_caching,
                        prefix_caching_hash_algo=cfg.prefix_caching_hash_algo)
    scheduler = Scheduler(sched, cache, EventLog(enabled=cfg.enable_events))  # checks capacity
    backend = select_backend(cfg.attention_backend, device)
    runner = ModelRunner(loaded, num_blocks, cfg.block_size, backend, kv_dtype)
    if device.type == "cpu":
        prepack_linears(loaded.model)  # at load, not on the first request's TTFT
    logger.info(
        "KV cache: %d blocks x %d tokens = %d token slots (%.1f MiB, from %s); "
        "maximum concurrency for %d tokens per request: %.2fx; attention backend: %s",
        num_blocks, cfg.block_size, cache.num_slots, num_blocks * per_block / 2**20, source,
        max_len, cache.num_slots / max_len, backend.name)
    governor = cpu_governor(cfg.num_threads) if device.type == "cpu" else None
    return EngineCore(cfg, loaded, scheduler, runner, per_block, governor)


def cpu_governor(num_threads: int | None = None):
    """A CoreGovernor for an engine on the default thread count (engine/cpu_threads.py),
    or None: an explicit count, one usable core, or ``KVSCOPE_ADAPT_THREADS=0``."""
    from engine.cpu_threads import CoreGovernor, governed, thread_count

    if not governed(num_threads):
        return None
    n = thread_count(num_threads)  # every usable core: governed means the default
    return CoreGovernor(n) if n >= 2 else None

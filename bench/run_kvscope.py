"""Run one workload through a fresh kvscope engine and record what happened.

Every run gets its own engine (own KV pool, cold prefix cache) around the one loaded
model, so runs do not see each other's cached blocks. All requests are queued at t0
in workload order; the engine is then stepped until it drains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from bench.measure import RssSampler, RunRecord, loadavg
from bench.workloads import Workload

# Engine settings every bench run shares; overridden per run (e.g. chunked prefill off).
BASE_ENGINE = dict(block_size=16, max_model_len=2048, enable_prefix_caching=True,
                   enable_chunked_prefill=True, seed=0)


def make_engine(loaded, model: str, max_num_seqs: int, num_kv_blocks: int,
                enable_events: bool = False, **overrides):
    """An LLMEngine over an already loaded model (no second load)."""
    from engine.config import EngineConfig
    from engine.llm_engine import build_engine

    kw = {**BASE_ENGINE, **overrides}
    cfg = EngineConfig(model=model, max_num_seqs=max_num_seqs, num_kv_blocks=num_kv_blocks,
                       enable_events=enable_events, **kw)
    return build_engine(cfg, loaded=loaded)


def _filled_slots(sched) -> int:
    """Token slots holding computed K/V, shared physical blocks counted once."""
    kv, bs = sched.kv, sched.kv.block_size
    fill: dict[int, int] = {}
    for rid, table in kv.tables.items():
        req = sched.requests.get(rid)
        n = req.num_computed_tokens if req is not None else 0
        for i, b in enumerate(table):
            f = min(bs, n - i * bs)
            if f > fill.get(b.id, 0):
                fill[b.id] = f
    return sum(fill.values())


def run_kvscope(engine, workload: Workload, system: str = "kvscope",
                listeners: Iterable[Callable] = (), progress=None) -> RunRecord:
    """Queue every request at t0, step until done; per-token times from step ends."""
    from engine import SamplingParams

    engine.step_listeners.extend(listeners)
    n = len(workload.requests)
    token_times: list[list[float]] = [[] for _ in range(n)]
    done = [0.0] * n
    ids: list[list[int]] = [[] for _ in range(n)]
    cached = [0] * n
    index = {f"r{i}": i for i in range(n)}
    sched = engine.engine_core.scheduler
    num_blocks = engine.engine_core.scheduler.cache_config.num_blocks
    per_block = engine.engine_core.kv_bytes_per_block
    per_slot = per_block // engine.engine_core.scheduler.cache_config.block_size
    peak_blocks = peak_slots = 0
    load0 = loadavg()
    with RssSampler() as rss:
        t0, c0 = time.perf_counter(), time.process_time()
        for i, r in enumerate(workload.requests):
            engine.add_request(list(r.prompt_ids), SamplingParams(
                temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True), request_id=f"r{i}")
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter() - t0
            peak_blocks = max(peak_blocks, num_blocks - sched.kv.pool.num_free)
            peak_slots = max(peak_slots, _filled_slots(sched))
            new = 0
            for o in outs:
                i = index[o.request_id]
                toks = o.outputs[0].token_ids
                k = len(toks) - len(token_times[i])
                token_times[i].extend([now] * k)
                new += k
                if o.finished:
                    done[i], ids[i], cached[i] = now, list(toks), o.num_cached_tokens
            if progress is not None and new:
                progress.update(new)
        makespan, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    for fn in listeners:
        engine.step_listeners.remove(fn)
    stats = engine.stats()
    extra = {
        "prefix_cache_hit_tokens": sum(cached),
        "prompt_tokens": workload.num_prompt_tokens,
        "prefix_cache_hit_rate": sum(cached) / workload.num_prompt_tokens,
        "num_preemptions": stats["num_preemptions"],
        "num_steps": sched.step,
    }
    if workload.shared_prefix_len:
        shared = workload.shared_prefix_len * n
        extra["shared_prefix_tokens_from_cache"] = sum(min(c, workload.shared_prefix_len) for c in cached) / shared
    return RunRecord(
        system=system, workload=workload.name, token_ids=ids, token_times=token_times,
        done_times=done, makespan=makespan, cpu_s=cpu_s, peak_rss=rss.peak, start_rss=rss.start,
        kv={"reserved": num_blocks * per_block, "allocated_peak": peak_blocks * per_block,
            "used_peak": peak_slots * per_slot},
        extra=extra, load_before=load0, load_after=loadavg(),
    )


def warm_up(engine) -> None:
    """One short generation so first-call costs (allocator, kernels) stay out of timings."""
    from engine import SamplingParams

    tok_ids = list(range(10, 40))
    engine.add_request(tok_ids, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       request_id="warmup-a")
    engine.add_request(tok_ids[:7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                       request_id="warmup-b")
    while engine.has_unfinished_requests():
        engine.step()


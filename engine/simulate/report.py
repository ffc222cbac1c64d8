"""What a simulation found, per pod and overall: vLLM's counter names where they exist.

Hit rates are vLLM's: prefix-cache hit tokens over query tokens of first admissions.
``reachable_hit_rate`` is the share of prompt tokens that some pod held cached when the
request was admitted (the best placement could have hit them); ``achieved`` is what the
chosen pod hit then; ``router_loss`` the difference. Times are on the virtual
clock of the step-cost model.
"""

from __future__ import annotations

from typing import Any

from engine.events.metrics.step_metrics import percentile
from engine.simulate.pod import RequestTimes
from engine.simulate.simulation import SimResult


MISS_CAUSES_OFF = ("misses not split into cold / evicted / partial (pass --miss-causes: about a third "
                   "more CPU on a fleet-scale trace); hit rates, evictions and every decision are the same")


def _pcts(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)
    return {f"p{q}": percentile(v, q) for q in (50, 90, 99)}


def _figures(pods, reqs: list[RequestTimes], makespan: float) -> dict[str, Any]:
    c: dict[str, int] = {}
    for p in pods:
        for k, v in p.log.counts.to_dict().items():
            c[k] = c.get(k, 0) + v
    prompt = sum(r.num_prompt_tokens for r in reqs)
    out = sum(r.num_output_tokens for r in reqs)
    hits = c["prefix_cache_hits"]
    queries = c["prefix_cache_queries"]
    ttft = [r.first_token - r.arrival for r in reqs if r.first_token is not None]
    queue = [r.first_scheduled - r.arrival for r in reqs if r.first_scheduled is not None]
    return {
        "num_requests": len(reqs),
        "num_steps": sum(p.num_steps for p in pods),
        "prompt_tokens": prompt,
        "generation_tokens": out,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "prefix_cache_resumed_queries": c["prefix_cache_resumed_queries"],
        "prefix_cache_resumed_hits": c["prefix_cache_resumed_hits"],
        "prefix_cache_miss_cold": c["prefix_cache_miss_cold"],
        "prefix_cache_miss_evicted": c["prefix_cache_miss_evicted"],
        "prefix_cache_miss_partial": c["prefix_cache_miss_partial"],
        "num_preemptions": c["num_preemptions"],
        "num_blocks_stored": sum(p.num_blocks_stored for p in pods),
        "num_blocks_evicted": c["num_evictions"],
        "reachable_tokens": sum(r.reachable_tokens for r in reqs),
        "ttft_s": _pcts(ttft),
        "queue_s": _pcts(queue),
        "makespan_s": makespan,
        "output_throughput_tps": out / makespan if makespan > 0 else None,
    }


def summarize(result: SimResult) -> dict[str, Any]:
    cfg = result.config
    overall = _figures(result.pods, result.requests, result.makespan)
    prompt = overall["prompt_tokens"]
    achieved = sum(r.num_cached_tokens or 0 for r in result.requests)
    reach = overall["reachable_tokens"]
    overall.update(
        achieved_hit_rate=achieved / prompt if prompt else None,
        reachable_hit_rate=(reach / prompt if prompt else None) if cfg.arrivals == "times" else None,
        router_loss=((reach - achieved) / prompt if prompt else None) if cfg.arrivals == "times" else None,
    )
    pods = []
    for p in result.pods:
        reqs = [r for r in result.requests if r.pod == p.index]
        d = _figures([p], reqs, p.clock)
        d.update(pod=p.index, num_blocks_used=p.num_blocks_used)
        pods.append(d)
    from engine.simulate.routers import ROUTERS

    notes = list(result.trace.notes)
    if not cfg.miss_causes:
        notes.append(MISS_CAUSES_OFF)
        for d in [overall, *pods]:
            for cause in ("cold", "evicted", "partial"):
                d[f"prefix_cache_miss_{cause}"] = None
    return {
        "trace": result.trace.source,
        "notes": notes,
        "settings": {
            "pods": cfg.num_pods, "router": cfg.router, "router_models": ROUTERS[cfg.router].models,
            "arrivals": cfg.arrivals, "num_kv_blocks": cfg.cache.num_blocks,
            "block_size": cfg.cache.block_size, "enable_prefix_caching": cfg.cache.enable_prefix_caching,
            "max_num_seqs": cfg.sched.max_num_seqs, "max_num_batched_tokens": cfg.sched.max_num_batched_tokens,
            "max_model_len": cfg.sched.max_model_len, "scheduling_policy": cfg.sched.policy,
            "step_cost": cfg.cost.to_dict(),
        },
        **overall,
        "pods": pods,
        "run_ids": result.run_ids,
    }


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def format_summary(s: dict[str, Any]) -> str:
    st = s["settings"]
    lines = [
        f"trace {s['trace']}: {s['num_requests']} requests, {s['prompt_tokens']} prompt tokens, "
        f"{s['generation_tokens']} generated",
        f"{st['pods']} pod(s) x {st['num_kv_blocks']} blocks of {st['block_size']} tokens, router "
        f"{st['router']} ({st['router_models']}), arrivals by {st['arrivals']}",
        f"prefix-cache hit rate {_rate(s['prefix_cache_hit_rate'])} "
        f"({s['prefix_cache_hits']} of {s['prefix_cache_queries']} tokens)"
        + (f"; reachable {_rate(s['reachable_hit_rate'])}, router loss {_rate(s['router_loss'])}"
           if s["reachable_hit_rate"] is not None else ""),
        f"blocks stored {s['num_blocks_stored']}, evicted {s['num_blocks_evicted']}; "
        f"preemptions {s['num_preemptions']}; steps {s['num_steps']}",
        f"TTFT p50 {_s(s['ttft_s']['p50'])} s, p99 {_s(s['ttft_s']['p99'])} s; queue p50 "
        f"{_s(s['queue_s']['p50'])} s; {_s(s['output_throughput_tps'])} output tok/s over "
        f"{_s(s['makespan_s'])} s (step cost: {st['step_cost']['source']})",
    ]
    if s["prefix_cache_miss_cold"] is not None:
        lines.insert(3, f"missed tokens: cold {s['prefix_cache_miss_cold']}, evicted "
                        f"{s['prefix_cache_miss_evicted']}, partial {s['prefix_cache_miss_partial']}")
    if len(s["pods"]) > 1:
        lines.append("pod  reqs  hit rate  stored  evicted  preempt  TTFT p50")
        for p in s["pods"]:
            lines.append(f"{p['pod']:>3}  {p['num_requests']:>4}  {_rate(p['prefix_cache_hit_rate']):>8}  "
                         f"{p['num_blocks_stored']:>6}  {p['num_blocks_evicted']:>7}  "
                         f"{p['num_preemptions']:>7}  {_s(p['ttft_s']['p50']):>8}")
    lines += [f"note: {n}" for n in s["notes"]]
    if s["run_ids"]:
        lines.append("recorded runs: " + " ".join(s["run_ids"]))
    return "\n".join(lines)

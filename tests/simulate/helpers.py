"""Hand-made traces whose right answers are known."""

from __future__ import annotations

from engine.core import CacheConfig, SchedulerConfig
from engine.simulate.cost import StepCost
from engine.simulate.simulation import SimConfig, simulate
from engine.simulate.trace import Trace, TracedRequest

BS = 16
COST = StepCost(0.01, 1e-5, 1e-3, 0.0)


def system(k: int, blocks: int = 4) -> list[int]:
    """System prompt k: ``blocks`` full blocks of tokens no other system prompt has."""
    return [1000 * (k + 1) + i for i in range(blocks * BS)]


def request(rid: str, t: float, tokens: list[int], out: int = 4) -> TracedRequest:
    return TracedRequest(rid, t, tuple(tokens), out)


def trace(reqs: list[TracedRequest]) -> Trace:
    return Trace(tuple(sorted(reqs, key=lambda r: r.arrival_s)), "test", {})


def run(tr: Trace, pods: int, router: str, num_blocks: int = 256, cost: StepCost = COST,
        router_args: dict | None = None, **sched):
    cfg = SimConfig(pods, router, SchedulerConfig(max_model_len=1024, max_num_batched_tokens=512, **sched),
                    CacheConfig(block_size=BS, num_blocks=num_blocks), cost, router_args=router_args or {})
    return simulate(tr, cfg)


def pods_of(result) -> list[int]:
    return [t.pod for t in result.requests]


def hits(result) -> int:
    return sum(p.log.counts.prefix_cache_hits for p in result.pods)

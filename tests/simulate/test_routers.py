"""Each router on a small hand-made trace whose right answer is known."""

from __future__ import annotations

import pytest

from engine.core import CacheConfig, SchedulerConfig
from engine.simulate.routers import ROUTERS
from engine.simulate.simulation import SimConfig, simulate
from tests.simulate.helpers import BS, COST, hits, pods_of, request, run, system, trace


def _families(n_families: int, per_family: int, gap: float = 1.0, order: str = "interleaved"):
    """per_family requests on each of n_families system prompts (4 blocks), each with a
    unique 20-token tail; arrivals ``gap`` s apart (long enough to finish alone)."""
    reqs = []
    for j in range(per_family):
        for k in range(n_families):
            i = len(reqs)
            reqs.append(request(f"f{k}-{j}", i * gap, system(k) + [50_000 + 100 * i + x for x in range(20)]))
    return trace(reqs)


def test_round_robin_over_n_pods_on_n_disjoint_system_prompts_hits_everything_reachable():
    """Arrivals cycle the families in the order round-robin cycles the pods: each pod
    sees one family, so every request after a family's first hits its 4 system blocks."""
    r = run(_families(4, 5), pods=4, router="round-robin")
    assert pods_of(r) == [i % 4 for i in range(20)]
    assert hits(r) == 4 * (5 - 1) * 4 * BS
    assert sum(t.reachable_tokens for t in r.requests) == hits(r)


def test_round_robin_loses_what_a_fifth_pod_scatters():
    """Five pods under four interleaved families: request i goes to pod i % 5, family
    i % 4, so a family's next request lands on a pod that never saw it until the pattern
    wraps (every 20 requests); the oracle keeps each family on one pod."""
    rr = run(_families(4, 5), pods=5, router="round-robin")
    oracle = run(_families(4, 5), pods=5, router="oracle")
    assert hits(rr) == 0  # 20 requests: (pod, family) pairs never repeat
    assert hits(oracle) == 4 * 4 * 4 * BS
    # every family's prefix was on some pod each time: all of it was reachable, none hit
    assert sum(t.reachable_tokens for t in rr.requests) == hits(oracle)


def test_least_loaded_spreads_a_burst_evenly_counting_queued_requests():
    reqs = [request(f"b{i}", 0.0, system(i)) for i in range(8)]
    r = run(trace(reqs), pods=4, router="least-loaded")
    assert pods_of(r) == [0, 1, 2, 3, 0, 1, 2, 3]


def test_oracle_equals_infinite_capacity_reuse():
    """Spaced arrivals, pools that never evict: the oracle's hits over 3 pods equal one pod
    that keeps everything."""
    tr = _families(3, 6)
    one = run(tr, pods=1, router="round-robin", num_blocks=4096)
    assert one.pods[0].log.counts.num_evictions == 0
    oracle = run(tr, pods=3, router="oracle")
    assert hits(oracle) == hits(one) == 3 * 5 * 4 * BS


def test_precise_prefix_learns_from_events_and_matches_the_oracle_when_they_have_arrived():
    tr = _families(3, 6)
    assert hits(run(tr, pods=3, router="precise-prefix")) == hits(run(tr, pods=3, router="oracle"))


def _mid_step():
    """A long prefill starts at t=0 (one step of 0.01 + 512 x 1e-3 s); a request with the
    same system prompt arrives 0.1 s later, inside that step."""
    long_tail = [60_000 + x for x in range(400)]
    return trace([request("a", 0.0, system(0) + long_tail), request("b", 0.1, system(0) + [7] * 5)])


def test_precise_prefix_cannot_see_blocks_whose_events_are_not_out_yet():
    """The oracle sees a's blocks (hashed when the step was scheduled) and sends b to a's
    pod; llm-d's scorer has no BlockStored for them until the step ends, so b goes to the
    least loaded pod."""
    from engine.simulate.cost import StepCost

    slow = StepCost(0.01, 1e-3, 1e-3, 0.0)
    assert pods_of(run(_mid_step(), pods=2, router="oracle", cost=slow)) == [0, 0]
    assert pods_of(run(_mid_step(), pods=2, router="precise-prefix", cost=slow)) == [0, 1]


def test_approx_prefix_routes_by_its_own_decisions_without_events():
    """GIE's scorer remembers where it sent a's chunks at once, so b follows a though no
    event said a's blocks exist; on disjoint prompts it falls back to the least loaded."""
    from engine.simulate.cost import StepCost

    slow = StepCost(0.01, 1e-3, 1e-3, 0.0)
    assert pods_of(run(_mid_step(), pods=2, router="approx-prefix", cost=slow)) == [0, 0]
    burst = trace([request(f"d{i}", 0.0, system(i)) for i in range(4)])
    assert pods_of(run(burst, pods=2, router="approx-prefix")) == [0, 1, 0, 1]


def test_approx_prefix_keeps_its_lru_as_a_set_and_move_to_end_per_chunk_would(monkeypatch):
    """The LRU's bulk update (chunks out, then in by last occurrence) against GIE's per-chunk
    rule, on random chunk lists with repeats and an LRU over capacity: the same keys in
    the same order, and the same pods chosen from them."""
    import random
    from collections import OrderedDict
    from itertools import takewhile
    from types import SimpleNamespace

    from engine.simulate.routers import approx_prefix

    rnd = random.Random(7)
    router = approx_prefix.ApproxPrefix(2, BS)
    ref = [OrderedDict() for _ in range(2)]
    pods = [SimpleNamespace(load=0), SimpleNamespace(load=1)]
    monkeypatch.setattr(approx_prefix, "LRU_CAPACITY", 25)
    chosen = set()
    for _ in range(400):
        chunks = [rnd.randrange(40) for _ in range(rnd.randint(0, 12))]
        monkeypatch.setattr(approx_prefix, "chunk_hashes", lambda tokens: chunks)
        for p in pods:
            p.load = rnd.randrange(3)
        k = router.route(SimpleNamespace(token_ids=[]), pods)
        score = [len(list(takewhile(lru.__contains__, chunks))) for lru in ref]
        assert k == max(range(2), key=lambda i: (score[i], -pods[i].load, -i))
        chosen.add(k)
        for h in chunks:
            ref[k][h] = None
            ref[k].move_to_end(h)
        while len(ref[k]) > 25:
            ref[k].popitem(last=False)
        assert [list(x) for x in router.lru] == [list(x) for x in ref]
    assert chosen == {0, 1} and all(len(x) == 25 for x in ref)


def test_dynamo_trades_overlap_against_the_blocks_in_flight():
    """Pod 0 holds a 4-block prefix but has a long request in flight; Dynamo's cost is
    overlap_weight x new prefill blocks + active blocks (its own bookkeeping): with the
    default weight 1 the busy pod loses, with weight 20 the overlap wins."""
    warm = request("warm", 0.0, system(0) + [9] * 3, out=1)
    hog = request("hog", 2.0, [70_000 + x for x in range(16 * 40)], out=200)
    probe = request("probe", 3.0, system(0) + [8] * 3)
    tr = trace([warm, hog, probe])
    # warm -> pod 0 (a tie); hog: warm is done, both idle, no overlap anywhere: a tie -> pod 0
    r = run(tr, pods=2, router="dynamo")
    assert pods_of(r)[:2] == [0, 0]
    # probe (5 blocks, 4 cached on pod 0): pod 0 = (5 - 4) + 40 hog + 5 = 46, pod 1 = 5 + 0 + 5 = 10
    assert pods_of(r)[2] == 1
    # weight 20: pod 0 = 20 x 1 + 40 + 5 = 65, pod 1 = 20 x 5 + 5 = 105 -> the overlap wins
    assert pods_of(run(tr, pods=2, router="dynamo", router_args={"overlap_weight": 20.0}))[2] == 0


@pytest.mark.parametrize("name", list(ROUTERS))
def test_every_router_serves_every_request_exactly_once(name):
    tr = _families(3, 4, gap=0.002)
    r = run(tr, pods=3, router=name)
    assert all(t.finished is not None for t in r.requests)
    assert sum(len(p.live) for p in r.pods) == 0
    assert sum(p.log.counts.num_requests_finished for p in r.pods) == 12
    assert all(t.reachable_tokens >= t.num_cached_tokens for t in r.requests)


@pytest.mark.parametrize("name", ["precise-prefix", "oracle"])
def test_a_simulation_that_keeps_no_events_is_the_one_that_keeps_them(name):
    """A pod that records builds every event; one that does not builds only counts (the
    fast path): the same routing, hits, evictions, preemptions and times."""
    import dataclasses

    from engine.simulate.report import summarize

    tr = _families(3, 6, gap=0.002)
    cfg = SimConfig(3, name, SchedulerConfig(max_model_len=128, max_num_batched_tokens=64, max_num_seqs=4),
                    CacheConfig(block_size=BS, num_blocks=12), COST, miss_causes=True)  # as a recording
    bare, kept = simulate(tr, cfg), simulate(tr, dataclasses.replace(cfg, keep_events=True))
    assert summarize(bare) == summarize(kept)
    assert [p.log.counts for p in bare.pods] == [p.log.counts for p in kept.pods]
    assert sum(p.log.counts.num_evictions for p in bare.pods) > 0
    assert [dataclasses.astuple(t) for t in bare.requests] == [dataclasses.astuple(t) for t in kept.requests]


@pytest.mark.parametrize("name", ["round-robin", "precise-prefix"])
def test_a_simulation_without_the_miss_cause_book_decides_and_counts_the_same(name):
    """``miss_causes=False`` (the default; a sweep's runs): the same routing, hits, evictions,
    preemptions and times; only the three causes are not reported, and the report says so."""
    import dataclasses

    from engine.simulate.report import MISS_CAUSES_OFF, summarize

    tr = _families(3, 6, gap=0.002)
    cfg = SimConfig(3, name, SchedulerConfig(max_model_len=128, max_num_batched_tokens=64, max_num_seqs=4),
                    CacheConfig(block_size=BS, num_blocks=12), COST)
    full, bare = simulate(tr, dataclasses.replace(cfg, miss_causes=True)), simulate(tr, cfg)
    assert all(p.kv.misses is None and p.kv.pool._on_cached is None for p in bare.pods)
    a, b = summarize(full), summarize(bare)
    causes = [f"prefix_cache_miss_{c}" for c in ("cold", "evicted", "partial")]
    assert all(b[k] is None for k in causes) and all(p[k] is None for p in b["pods"] for k in causes)
    assert a["prefix_cache_miss_cold"] > 0 and a["prefix_cache_miss_partial"] > 0
    assert b["notes"] == [MISS_CAUSES_OFF] and a["notes"] == []
    for d in [a, b, *a["pods"], *b["pods"]]:
        for k in causes:
            d.pop(k)
    a.pop("notes"), b.pop("notes")
    assert a == b and a["num_blocks_evicted"] > 0
    assert [dataclasses.astuple(t) for t in full.requests] == [dataclasses.astuple(t) for t in bare.requests]
    # every miss counted, as cold: queries = hits + misses still
    c = bare.pods[0].log.counts
    assert c.prefix_cache_miss_cold == c.prefix_cache_queries - c.prefix_cache_hits
    kept = simulate(tr, dataclasses.replace(cfg, keep_events=True))  # events carry the causes
    assert kept.config.miss_causes and all(p.kv.misses is not None for p in kept.pods)
    assert summarize(kept)["prefix_cache_miss_evicted"] == summarize(full)["prefix_cache_miss_evicted"]


def test_a_pod_that_keeps_no_events_keeps_no_block_tokens_and_decides_the_same():
    """Nothing reads a cached block's tokens in a pod without events (no snapshot, no
    event): the pool does not keep them (``BlockPool.keep_tokens``), and every decision
    and count is what a pod that keeps them makes."""
    from dataclasses import replace

    from engine.simulate.report import summarize

    tr = trace([request(f"r{i}", 0.01 * i, system(i % 3) + [7 + i] * (2 * BS + i % 5), out=20)
                for i in range(60)])
    base = run(tr, 2, "round-robin", num_blocks=64)
    kept = simulate(tr, replace(base.config, keep_events=True))
    keys = ("prefix_cache_hit_rate", "prefix_cache_hits", "num_blocks_evicted", "num_preemptions", "ttft_s")
    assert [summarize(base)[k] for k in keys] == [summarize(kept)[k] for k in keys]
    assert [(t.pod, t.num_cached_tokens, t.first_token, t.finished) for t in base.requests] == \
        [(t.pod, t.num_cached_tokens, t.first_token, t.finished) for t in kept.requests]
    for a, b in zip(base.pods, kept.pods):
        assert a.log.counts.num_evictions == b.log.counts.num_evictions > 0
        assert {h: blk.id for h, blk in a.kv.pool.cached.items()} == {h: blk.id for h, blk in b.kv.pool.cached.items()}
        assert all(blk.token_ids is None for blk in a.kv.pool.cached.values())
        assert all(len(blk.token_ids) == BS for blk in b.kv.pool.cached.values())

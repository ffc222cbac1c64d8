"""Prefix-cache hit accounting as vLLM does it: a resumed (preempted) request's lookup
is counted apart from first admissions, and with prefix caching off the vLLM-named
counters count nothing (vllm/v1/metrics/stats.py, PrefixCacheStats.record)."""

import dataclasses

import pytest

from engine.events.folds.reducer import PoolState
from engine.events.metrics.step_metrics import MetricsConfig, MetricsTracker
from engine.events.schema.types import PrefixLookup

from tests.core.driver import make_scheduler, req, step


def run_low_high(prefix: bool):
    """4 blocks of 16: "low" (30 tokens) then "high" (32); high's first decode needs a
    third block, so high (the latest arrival) is preempted, then resumes once low is done.
    Returns (scheduler, prefix_lookup events, last metrics); checks the reducer on the way."""
    s = make_scheduler(block_size=16, num_blocks=4, max_model_len=64, budget=64,
                       max_num_seqs=2, prefix=prefix)
    s.add_request(req("low", range(30), max_tokens=2))
    s.add_request(req("high", range(100, 132), max_tokens=4))
    metrics = MetricsTracker(MetricsConfig(16, 4, 64))
    state = PoolState(4, 16)
    lookups, preempted, last = [], [], None
    while s.has_unfinished_requests():
        out, _, _ = step(s)
        preempted += out.preempted
        events = s.log.drain()
        state.apply_events(events)
        assert dataclasses.replace(state.to_snapshot(), step=s.step) == s.snapshot()
        lookups += [e for e in events if isinstance(e, PrefixLookup)]
        last = metrics.update(events, s.pool_summary(), float(s.step))
    assert preempted == ["high"]
    return s, lookups, last


def test_resumed_lookup_is_counted_apart_from_first_admissions():
    s, lookups, m = run_low_high(prefix=True)
    assert [(e.request_id, e.num_query_tokens, e.num_hit_tokens, e.resumed) for e in lookups] == [
        ("low", 30, 0, False), ("high", 32, 0, False),
        ("high", 33, 32, True),  # its own two full blocks, still cached; +1 generated token
    ]
    # vLLM's counters read 62 queried / 0 hit (kvscope read 95 / 32 before resumed
    # lookups were kept apart); the resumed lookup is reported on its own
    counts = s.log.counts
    assert (counts.prefix_cache_queries, counts.prefix_cache_hits) == (62, 0)
    assert (counts.prefix_cache_resumed_queries, counts.prefix_cache_resumed_hits) == (33, 32)
    assert (m["prefix_cache_queries"], m["prefix_cache_hits"]) == (62, 0)
    assert (m["prefix_cache_resumed_queries"], m["prefix_cache_resumed_hits"]) == (33, 32)
    assert m["prefix_cache_hit_rate"] == 0.0
    # misses by cause cover first admissions: 2 cold blocks, the rest partial
    assert [m[f"prefix_cache_miss_{c}"] for c in ("cold", "evicted", "partial", "disabled")] \
        == [32, 0, 30, 0]
    assert m["prefix_cache_miss_cold"] + m["prefix_cache_miss_partial"] == 62 - 0


def test_with_prefix_caching_off_the_vllm_counters_count_nothing():
    s, lookups, m = run_low_high(prefix=False)
    assert [(e.request_id, e.miss_disabled, e.resumed) for e in lookups] == [
        ("low", 30, False), ("high", 32, False), ("high", 33, True)]
    for key in ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_resumed_queries",
                "prefix_cache_resumed_hits"):
        assert m[key] == 0 and getattr(s.log.counts, key) == 0, key
    assert m["prefix_cache_hit_rate"] is None
    # kvscope's own figure: the first admissions' tokens, looked up while caching was off
    assert m["prefix_cache_miss_disabled"] == s.log.counts.prefix_cache_miss_disabled == 62


def test_a_lookup_whose_tokens_do_not_add_up_is_refused():
    with pytest.raises(ValueError, match="do not add up"):
        PrefixLookup(1, "r", 10, 4, 4, 0, 0, 0)
    with pytest.raises(ValueError, match="prefix caching off"):
        PrefixLookup(1, "r", 10, 0, 6, 0, 0, 4)

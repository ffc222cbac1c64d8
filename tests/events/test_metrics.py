"""Metrics on small hand-checked states and event lists."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.folds.reducer import PoolState
from engine.events.metrics.step_metrics import (
    MISS_CAUSES, LatencyObservations, MetricsConfig, MetricsTracker, percentile,
)
from engine.events.schema.types import (
    BlockAllocated, BlockEvicted, CowCopy, PrefixCacheReset, PrefixHit, PrefixLookup,
    RequestFinished, RequestPreempted, RequestProgress, RequestScheduled,
)


def summarize_snapshot(d):
    """The summary of a snapshot written as its JSON form (hand-checked states)."""
    return PoolSnapshot.from_dict(d).summary()


def block(i, ref, fill, h=None):
    return {"id": i, "ref_count": ref, "hash": h, "num_tokens": fill, "token_ids": None}


def snap(blocks=None, requests=None, bs=4):
    blocks = blocks or [block(i, 0, 0) for i in range(4)]
    return {"step": 1, "block_size": bs, "num_blocks": len(blocks), "blocks": blocks,
            "free_queue": [b["id"] for b in blocks if b["ref_count"] == 0],
            "requests": requests or {}}


def req(status):
    return {"status": status, "block_table": [], "num_tokens": 1, "num_computed_tokens": 0,
            "num_cached_tokens": 0, "token_ids": [], "parent_id": None, "arrival_index": 0}


def test_pool_figures_hand_checked():  # PoolSummary.figures of a snapshot dict
    # blocks 0, 1 shared by two requests (4 + 2 filled); 2 free but cached; 3 free
    s = snap([block(0, 2, 4, "h0"), block(1, 2, 2), block(2, 0, 4, "h2"), block(3, 0, 0)])
    assert summarize_snapshot(s).figures() == {
        "kv_cache_usage": 0.5,            # 2 of 4 blocks referenced
        "kv_token_usage": 6 / 16,         # cached-free slots do not count
        "internal_fragmentation": 0.25,   # 1 - 6 / (2 blocks * 4), shared counted once
        "num_used_blocks": 2, "num_filled_slots": 6, "num_free_blocks": 2,
        "num_shared_blocks": 2,
        "num_cached_free_blocks": 1,
    }
    assert PoolState(3, 4).to_snapshot().summary().figures()["internal_fragmentation"] == 0.0


STEP1 = [
    PrefixLookup(1, "a", 10, 4, 4, 0, 2, 0),
    PrefixHit(1, "a", (0,), 4),
    PrefixLookup(1, "b", 8, 0, 0, 4, 4, 0),
    RequestScheduled(1, "a", 6, "prefill", 4),
    RequestScheduled(1, "b", 8, "prefill", 0),
    RequestScheduled(1, "c", 1, "decode", 9),
    RequestPreempted(1, "d"),
    CowCopy(1, "c", 1, 2, 0, src_ref_count=1),
    BlockEvicted(1, 3, "h3", "reuse"), BlockAllocated(1, 3, "b", 1),  # LRU eviction
    BlockEvicted(1, 5, "h5", "reset"), BlockEvicted(1, 6, "h6", "reset"), PrefixCacheReset(1),
    BlockEvicted(1, 7, "h7", "rollback"),  # a failed forward withdrew a hash
    RequestProgress(1, "c", 11, 10, (5, 6)),
    RequestFinished(1, "e", "stop"),
]


def test_step_counters_and_scheduler_figures():
    m = MetricsTracker(MetricsConfig(block_size=4, num_blocks=4, max_num_batched_tokens=32))
    s = snap(requests={"a": req("running"), "b": req("running"), "w": req("waiting"),
                       "d": req("preempted")})
    out = m.update(STEP1, summarize_snapshot(s), ts=100.0)
    assert (out["prefix_cache_queries"], out["prefix_cache_hits"]) == (18, 4)
    assert out["prefix_cache_hit_rate"] == out["prefix_cache_hit_rate_step"] == 4 / 18
    assert [out[f"prefix_cache_miss_{c}"] for c in MISS_CAUSES] == [4, 4, 6, 0]
    assert (out["num_preemptions"], out["cow_copies"], out["num_evictions"]) == (1, 1, 1)
    assert (out["num_reset_evictions"], out["num_rollback_evictions"]) == (2, 1)
    assert out["prefix_cache_resets"] == 1 and out["num_requests_finished"] == 1
    assert (out["num_requests_waiting"], out["num_requests_running"],
            out["num_requests_preempted"]) == (1, 2, 1)
    assert (out["num_prefill_tokens"], out["num_decode_tokens"], out["num_batched_tokens"],
            out["token_budget"], out["budget_used"]) == (14, 1, 15, 32, 15 / 32)
    assert out["num_output_tokens_step"] == 2

    out2 = m.update([], summarize_snapshot(s), ts=101.0)
    assert out2["prefix_cache_queries"] == 18 and out2["prefix_cache_queries_step"] == 0
    assert out2["prefix_cache_hit_rate"] == 4 / 18 and out2["prefix_cache_hit_rate_step"] is None
    assert out2["num_preemptions"] == 1 and out2["num_preemptions_step"] == 0

    m.reset()
    out3 = m.update([], summarize_snapshot(s), ts=102.0)
    assert out3["prefix_cache_queries"] == 0 and out3["prefix_cache_hit_rate"] is None
    assert out3["output_throughput_tps"] is None


def test_latency_percentiles_and_throughput_window():
    m = MetricsTracker(MetricsConfig(4, 4, 16, throughput_window_s=10.0))
    s = snap()
    prog = lambda n: [RequestProgress(1, "a", 1, 1, tuple(range(n)))]  # noqa: E731
    o = m.update(prog(2), summarize_snapshot(s), 0.0, LatencyObservations(ttft_s=(0.1, 0.3)))
    assert o["ttft_s"] == [0.1, 0.3] and o["itl_s"] == [] and o["e2e_p50_s"] is None
    assert o["ttft_p50_s"] == pytest.approx(0.2)
    assert o["output_throughput_tps"] is None  # one step: no interval yet
    o = m.update(prog(3), summarize_snapshot(s), 1.0, LatencyObservations(ttft_s=(0.2,), itl_s=(0.05,)))
    assert o["ttft_p50_s"] == pytest.approx(0.2)
    assert o["ttft_p90_s"] == pytest.approx(0.28)  # 0.2 + 0.8 * (0.3 - 0.2)
    assert o["itl_p99_s"] == pytest.approx(0.05)
    assert o["output_throughput_tps"] == pytest.approx(3.0)  # 3 tokens over 1 s
    o = m.update(prog(5), summarize_snapshot(s), 2.0)
    assert o["output_throughput_tps"] == pytest.approx(4.0)  # (3 + 5) over 2 s
    assert o["num_output_tokens"] == 10
    o = m.update(prog(1), summarize_snapshot(s), 20.0)  # everything older left the 10 s window
    assert o["output_throughput_tps"] is None


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([1.0], 99) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_config_validation():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        MetricsConfig(4, 4, 0)
    with pytest.raises(ValueError, match="negative"):
        LatencyObservations(ttft_s=(-1.0,))


# A lookup is either with caching on (no disabled tokens) or off (all disabled), and
# either a first admission or a resumed (preempted) request's.
_enabled = st.tuples(*(st.integers(0, 64) for _ in range(4)), st.booleans()).map(
    lambda t: PrefixLookup(1, "r", sum(t[:4]), t[0], t[1], t[2], t[3], 0, resumed=t[4]))
_disabled = st.tuples(st.integers(1, 64), st.booleans()).map(
    lambda t: PrefixLookup(1, "r", t[0], 0, 0, 0, 0, t[0], resumed=t[1]))
lookup = st.one_of(_enabled, _disabled)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(lookup, max_size=4), max_size=6))
def test_miss_causes_add_up_to_queries_minus_hits(steps):
    m = MetricsTracker(MetricsConfig(4, 4, 16))
    totals = {"first": 0, "resumed_q": 0, "resumed_h": 0}
    for i, evs in enumerate(steps):
        o = m.update(evs, summarize_snapshot(snap()), float(i))
        firsts = [e for e in evs if not e.resumed]
        resumed = [e for e in evs if e.resumed and e.caching_enabled]
        totals["first"] += sum(e.num_query_tokens for e in firsts)
        totals["resumed_q"] += sum(e.num_query_tokens for e in resumed)
        totals["resumed_h"] += sum(e.num_hit_tokens for e in resumed)
        for suffix in ("", "_step"):
            # first admissions: hits and the misses by cause (disabled included) cover
            # every token looked up; the vLLM-named queries leave the disabled ones out
            misses = sum(o[f"prefix_cache_miss_{c}{suffix}"] for c in MISS_CAUSES)
            looked_up = (sum(e.num_query_tokens for e in firsts) if suffix else totals["first"])
            assert o[f"prefix_cache_hits{suffix}"] + misses == looked_up
            assert o[f"prefix_cache_queries{suffix}"] == looked_up - o[
                f"prefix_cache_miss_disabled{suffix}"]
        assert (o["prefix_cache_resumed_queries"], o["prefix_cache_resumed_hits"]) == \
            (totals["resumed_q"], totals["resumed_h"])


def test_latency_percentiles_keep_a_bounded_window():
    """Percentiles rank the latest MAX_LATENCY_SAMPLES observations. Before this (main at
    b923685) every observation of the run stayed in a sorted list: memory grew with
    every token served and each insert moved the whole list (a soak's steps slowed)."""
    from engine.events.metrics.step_metrics import MAX_LATENCY_SAMPLES, LatencyWindow

    w = LatencyWindow(4)
    for v in (5.0, 1.0, 3.0, 1.0, 2.0, 9.0):
        w.add(v)
    assert w.sorted == [1.0, 2.0, 3.0, 9.0] and len(w) == 4  # 5.0 and the first 1.0 left
    m = MetricsTracker(MetricsConfig(4, 4, 16))
    s = snap()
    n = MAX_LATENCY_SAMPLES + 1000
    o = m.update([], summarize_snapshot(s), 0.0, LatencyObservations(itl_s=tuple(float(i) for i in range(n))))
    assert len(m._samples["itl"]) == MAX_LATENCY_SAMPLES
    latest = [float(i) for i in range(1000, n)]
    assert o["itl_p50_s"] == pytest.approx(percentile(latest, 50)) and o["itl_p99_s"] == pytest.approx(percentile(latest, 99))

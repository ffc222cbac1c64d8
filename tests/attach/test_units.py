"""The pure parts of attach mode, exactly: hash keys, the sequence tracker, the hash-only
reducer and its residency figures, the prefix tree, the prefix lookup, Prometheus text."""

from __future__ import annotations

import pytest

from engine.attach.pod_source import PodSource, bind_endpoint, default_pod_name, subscriber_binds
from engine.attach.prefix_match import (
    BY_TOKENS, KVSCOPE, SCHEMES, SHA256, detect_scheme, longest_prefix, stream_chain,
)
from engine.attach.prom_scrape import ScrapeFold, quantile, read_sample
from engine.attach.seq_tracker import SeqTracker, Verdict
from engine.core.errors import ConfigError
from engine.core.hashing import hash_block
from engine.events.folds.hash_cache_snapshot import HashCacheSnapshot
from engine.events.folds.hash_cache_state import HashCacheState
from engine.events.folds.prefix_tree import PrefixTree
from engine.events.folds.run_kind import RunKind, empty_state, snapshot_from_dict, state_from_snapshot
from engine.events.metrics.residency import ResidencyLog
from engine.events.schema.hash_key import hash_key
from engine.events.schema.types import KVAllCleared, KVBlockRemoved, KVBlockStored, KVGap, KVSegment


def test_hash_keys_for_ints_and_bytes():
    assert hash_key(255) == "00000000000000ff"
    assert hash_key((1 << 64) - 1) == hash_key(-1) == "ffffffffffffffff"
    assert hash_key(b"\x01\xab") == "01ab"
    for bad in (True, 1 << 64, -(1 << 63) - 1, b"", "ab", None, 1.5):
        with pytest.raises(ValueError):
            hash_key(bad)


def test_seq_tracker_reads_next_gaps_duplicates_and_restarts():
    t = SeqTracker()
    d = t.classify(3, b"c")
    assert d.verdict is Verdict.FIRST and d.missing == range(0, 3)
    assert t.start_segment() == 0
    for seq, p in ((0, b"a"), (1, b"b"), (2, b"x"), (3, b"c")):
        t.accept(seq, p)
    assert t.classify(4, b"d").verdict is Verdict.NEXT
    assert t.classify(1, b"b").verdict is Verdict.DUPLICATE  # a replay overlapping the live stream
    d = t.classify(7, b"g")
    assert d.verdict is Verdict.GAP and d.missing == range(4, 7)
    t.skip(range(4, 7))  # a hole
    assert t.classify(7, b"g").verdict is Verdict.NEXT
    d = t.classify(1, b"other")  # lower and not what we applied: the publisher restarted
    assert d.verdict is Verdict.RESTART and d.missing == range(0, 1)
    assert t.start_segment() == 1 and t.classify(0, b"z").verdict is Verdict.NEXT
    assert t.classify(0, b"z").verdict is Verdict.NEXT  # nothing of segment 0 is remembered


def stored(step, pod, hashes, parent, block_size=2, ts=None, medium="GPU"):
    tokens = tuple(t for h in hashes for t in (int(h, 16),) * block_size)
    return KVBlockStored(step, pod, tuple(hashes), parent, tokens, block_size,
                         float(step) if ts is None else ts, medium)


def test_hash_reducer_rules_and_residency():
    log = ResidencyLog()
    s = HashCacheState(residency=log)
    s.apply_events([
        KVSegment(0, "a", 0, 0, "attach"),
        stored(1, "a", ["a1", "a2", "a3"], None, ts=10.0),
        stored(2, "a", ["b1"], "a1", ts=12.0),  # branch below a1: a1 was shared
        stored(3, "a", ["a4"], "a3", ts=13.0),  # extends a leaf: an access, not a reuse
        KVBlockRemoved(4, "a", ("a2", "zz"), 20.0, "GPU"),  # zz was never stored here
        stored(5, "b", ["a1"], None, ts=21.0),  # another pod: its own cache
    ])
    p = s.pods["a"]
    assert set(s.cached("a")) == {"a1", "a3", "a4", "b1"} and s.cached("b") == {"a1"}
    assert (p.stored_blocks, p.removed_blocks, p.unknown_removals) == (5, 1, 1)
    blocks = {b.hash: b for b in s.to_snapshot().pods["a"].blocks}
    assert blocks["a3"].parent == "a2"  # its parent left; it stays, as a root of its own
    assert (blocks["a1"].reuses, blocks["a1"].last_access_ts) == (1, 13.0)
    assert (blocks["a3"].reuses, blocks["a3"].last_access_ts) == (0, 13.0)
    # a2: stored at 10, last accessed by the branch at 12 and the extension at 13, removed at 20
    assert log.values("lifetime_s") == [10.0] and log.values("idle_before_evict_s") == [7.0]
    assert log.values("reuse_gap_s") == [2.0]  # a1: 10 -> 12 (the branch)
    s.apply_event(stored(6, "a", ["a2"], "a1", ts=25.0))  # recomputed 5 s after its eviction
    assert log.values("recompute_gap_s") == [5.0]
    s.apply_events([KVGap(7, "a", 0, 9, 11, "not in the replay buffer"), KVAllCleared(8, "a", 30.0)])
    snap = s.to_snapshot()
    assert snap.pods["a"].blocks == () and snap.pods["a"].incomplete and snap.pods["a"].clears == 1
    assert snap.pods["b"].num_blocks == 1
    s.apply_event(KVSegment(9, "a", 1, 0, "restart"))
    assert not s.to_snapshot().pods["a"].incomplete  # the hole was in segment 0
    s.apply_event(KVSegment(10, "b", 1, 0, "restart"))
    assert s.cached("b") == set()


def test_media_are_separate_caches_and_a_removal_without_medium_finds_the_block():
    s = HashCacheState()
    s.apply_events([stored(1, "a", ["a1"], None, medium="GPU"), stored(2, "a", ["a1"], None, medium="CPU")])
    assert len(s.pods["a"].blocks) == 2
    s.apply_event(KVBlockRemoved(3, "a", ("a1",), 3.0, "CPU"))
    assert [b.medium for b in s.to_snapshot().pods["a"].blocks] == ["GPU"]
    s.apply_event(KVBlockRemoved(4, "a", ("a1",), 4.0, None))  # older vLLM: no medium
    assert s.cached("a") == set() and s.pods["a"].unknown_removals == 0


def test_hash_snapshot_round_trips_and_dispatches_by_kind():
    s = HashCacheState()
    s.apply_events([KVSegment(0, "a", 0, 0, "attach"), stored(1, "a", ["a1", "a2"], None),
                    KVGap(2, "a", 0, 5, 5, "undecodable: x")])
    snap = s.to_snapshot()
    back = snapshot_from_dict(snap.to_dict())
    assert isinstance(back, HashCacheSnapshot) and back == snap
    again = state_from_snapshot(back)
    again.apply_event(stored(3, "a", ["a3"], "a2"))
    s.apply_event(stored(3, "a", ["a3"], "a2"))
    assert again.to_snapshot() == s.to_snapshot()
    copy = s.copy()
    copy.apply_event(KVAllCleared(4, "a", 9.0))
    assert s.cached("a") == {"a1", "a2", "a3"}
    assert isinstance(empty_state("attached", {}), HashCacheState)
    assert type(empty_state(None, {"num_blocks": 4, "block_size": 2})).__name__ == "PoolState"
    assert RunKind.of(None) is RunKind.ENGINE
    with pytest.raises(ValueError, match="unknown run kind"):
        RunKind.of("nope")


def test_a_recomputed_block_is_a_second_copy_and_outlives_one_removal():
    """vLLM v1 keeps two physical blocks under one hash when a request recomputes a cached
    block, and sends BlockStored for each and BlockRemoved for each: the hash stays cached
    until its last copy goes (the tiny-pool case of issue 32)."""
    log = ResidencyLog()
    s = HashCacheState(residency=log)
    s.apply_events([stored(1, "a", ["a1", "a2"], None, ts=1.0),
                    stored(2, "a", ["a2"], "a1", ts=2.0)])  # recomputed: a second copy
    blocks = {b.hash: b for b in s.to_snapshot().pods["a"].blocks}
    assert (blocks["a2"].copies, blocks["a2"].reuses, blocks["a1"].copies) == (2, 0, 1)
    assert log.values("reuse_gap_s") == []  # a recomputation is not a reuse
    s.apply_event(KVBlockRemoved(3, "a", ("a2",), 3.0, "GPU"))
    assert s.cached("a") == {"a1", "a2"} and log.values("lifetime_s") == []
    again = HashCacheState.from_snapshot(s.to_snapshot().to_dict())  # copies survive a snapshot
    assert {b.hash: b.copies for b in again.to_snapshot().pods["a"].blocks} == {"a1": 1, "a2": 1}
    for state in (s, again):
        state.apply_event(KVBlockRemoved(4, "a", ("a2",), 4.0, "GPU"))
        assert state.cached("a") == {"a1"}
    p = s.pods["a"]
    assert (p.stored_blocks, p.removed_blocks, p.unknown_removals) == (2, 2, 0)
    assert log.values("lifetime_s") == [3.0]  # stored at 1, its last copy removed at 4


def test_a_placeholder_store_holds_a_hash_without_tokens():
    s = HashCacheState()
    s.apply_events([stored(1, "a", ["a1"], None, block_size=4),
                    KVBlockStored(2, "a", ("c1",), None, (), 0, 2.0, "CPU_PINNED", locality="LOCAL")])
    view = s.to_snapshot().pods["a"]
    assert view.block_size == 4 and s.cached("a") == {"a1", "c1"}
    assert {b.hash: (b.medium, b.token_ids) for b in view.blocks}["c1"] == ("CPU_PINNED", ())
    assert KVBlockStored(2, "a", ("c1",), None, (), 0, 2.0).is_placeholder


def test_prefix_tree_and_shared_prefixes():
    s = HashCacheState()
    s.apply_events([stored(1, "a", ["01", "02", "03"], None), stored(2, "a", ["04", "05"], "02"),
                    stored(3, "a", ["06"], "02"), stored(4, "a", ["07"], "01"),
                    stored(5, "a", ["09"], "08")])  # an orphan: parent 08 never stored
    tree = PrefixTree(s.to_snapshot().pods["a"])
    assert tree.roots == ["01", "09"]
    assert tree.depth["05"] == 4 and tree.size["01"] == 7 and tree.leaves["01"] == 4
    assert tree.path("05") == ["01", "02", "04", "05"]
    shared = tree.shared_prefixes()
    assert [(x.hash, x.num_blocks, x.num_tokens, x.continuations, x.blocks_below, x.rooted)
            for x in shared] == [("02", 2, 4, 3, 4, True), ("01", 1, 2, 4, 6, True)]
    assert shared[0].token_ids == (1, 1, 2, 2) and shared[0].tokens_shared == 8


def test_prefix_lookup_by_vllms_sha256_hashes_and_by_token_ids():
    bs = 4
    prompt = list(range(50, 63))  # 13 tokens: 3 full blocks
    h0 = hash_block(None, prompt[0:4], algo="sha256")
    h1 = hash_block(h0, prompt[4:8], algo="sha256")
    chain = stream_chain(prompt, bs)
    assert chain[:2] == [hash_key(int(h0[-16:], 16)), hash_key(int(h1[-16:], 16))] and len(chain) == 3
    s = HashCacheState()
    s.apply_events([KVBlockStored(1, "a", tuple(chain[:2]), None, tuple(prompt[:8]), bs, 1.0, "GPU"),
                    KVBlockStored(2, "b", ("f1",), None, tuple(prompt[:4]), bs, 1.0, "GPU")])
    pods = s.to_snapshot().pods
    assert detect_scheme(pods["a"]) == SHA256 and detect_scheme(pods["b"]) is None
    a = longest_prefix(pods["a"], prompt, SHA256)
    assert (a.num_blocks, a.num_tokens, a.hit_tokens, a.hashes) == (2, 8, 8, tuple(chain[:2]))
    assert longest_prefix(pods["a"], prompt, None).hashes == a.hashes
    b = longest_prefix(pods["b"], prompt, None)
    assert (b.method, b.num_blocks, b.hashes) == (BY_TOKENS, 1, ("f1",))
    # the last prompt token is never a hit: an 8-token prompt with 2 cached blocks hits 4
    assert longest_prefix(pods["a"], prompt[:8], SHA256).hit_tokens == 4
    assert longest_prefix(pods["a"], [9] + prompt[1:], None).num_blocks == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_detect_scheme_tells_each_hash_algorithm_apart(scheme):
    prompt = list(range(7, 19))
    chain = stream_chain(prompt, 4, scheme)
    assert len(set(chain)) == 3 and all(stream_chain(prompt, 4, o) != chain for o in SCHEMES if o != scheme)
    s = HashCacheState()
    s.apply_events([KVBlockStored(1, "a", tuple(chain), None, tuple(prompt), 4, 1.0, "GPU")])
    pod = s.to_snapshot().pods["a"]
    assert detect_scheme(pod) == scheme
    assert longest_prefix(pod, prompt + [1], scheme).hashes == tuple(chain)
    assert KVSCOPE in SCHEMES


VLLM_TEXT = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} {hits}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} {pre}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} {b1}
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} {b2}
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} {b2}
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} {b2}
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} {tsum}
"""


def vllm(queries, hits, pre, b1, b2, tsum):
    text = VLLM_TEXT
    for k, v in dict(queries=queries, hits=hits, pre=pre, b1=b1, b2=b2, tsum=tsum).items():
        text = text.replace("{" + k + "}", str(v))
    return read_sample(text)


def test_vllm_metrics_fold_into_figures_of_this_run_only():
    fold = ScrapeFold()
    fold.add(vllm(1000, 400, 2, 5, 10, 3.0))  # before the attach: the baseline
    first = fold.figures()
    assert first["kv_cache_usage"] == 0.25 and first["num_requests_running"] == 3.0
    assert first["prefix_cache_queries"] == 0 and first["prefix_cache_hit_rate"] is None
    fold.add(vllm(1100, 450, 3, 7, 14, 4.0))
    fold.add(vllm(1300, 600, 3, 7, 18, 5.2))
    f = fold.figures()
    assert (f["prefix_cache_queries"], f["prefix_cache_hits"], f["num_preemptions"]) == (300, 200, 1)
    assert f["prefix_cache_hit_rate"] == pytest.approx(200 / 300)
    assert f["prefix_cache_hit_rate_recent"] == pytest.approx(150 / 200)
    assert f["ttft_count"] == 8 and f["ttft_mean_s"] == pytest.approx(2.2 / 8)
    # 2 of the 8 in (0, 0.1], 6 in (0.1, 1]: the median is 0.1 + 0.9 * (4 - 2) / 6
    assert f["ttft_p50_s"] == pytest.approx(0.1 + 0.9 * 2 / 6)
    fold.add(vllm(50, 10, 0, 1, 1, 0.1))  # the engine restarted: counters from 0
    assert fold.figures()["prefix_cache_queries"] == 350


def test_sglang_metrics_and_junk():
    raw = read_sample("# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n"
                      "# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate{model_name=\"m\"} 0.3\n"
                      "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 2\n"
                      "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 4\n")
    fold = ScrapeFold()
    fold.add(raw)
    f = fold.figures()
    assert (f["kv_cache_usage"], f["prefix_cache_hit_rate"], f["num_requests_running"],
            f["num_requests_waiting"]) == (0.5, 0.3, 2, 4)
    with pytest.raises(ValueError, match="not Prometheus text"):
        read_sample("this is { not metrics")
    assert quantile(0.5, {}, 0) is None
    assert quantile(0.99, {1.0: 1, float("inf"): 10}, 10) == 1.0


def test_pod_sources_are_checked():
    assert default_pod_name("tcp://10.0.0.5:5557") == "10.0.0.5:5557"
    assert subscriber_binds("tcp://*:5557") and not subscriber_binds("ipc:///tmp/x")
    assert not subscriber_binds("tcp://127.0.0.1:5557")
    for kw, msg in (({"endpoint": "http://x:1"}, "ZMQ endpoint"),
                    ({"endpoint": "tcp://x:1", "replay": "x:2"}, "--replay"),
                    ({"endpoint": "tcp://x:1", "metrics": "x:8000/metrics"}, "http"),
                    ({"endpoint": "tcp://x:1", "pod": ""}, "pod name")):
        with pytest.raises(ConfigError, match=msg):
            PodSource(**{"pod": "p", **kw})


def test_a_wildcard_kv_events_endpoint_binds_loopback_unless_allow_remote():
    assert bind_endpoint("tcp://*:5557", False) == "tcp://127.0.0.1:5557"
    assert bind_endpoint("tcp://[::]:5557", False) == "tcp://[::1]:5557"
    assert bind_endpoint("tcp://*:5557", True) == "tcp://*:5557"
    assert bind_endpoint("tcp://[::]:5557", True) == "tcp://[::]:5557"


def test_runs_listing_shows_no_model_for_an_attached_run():
    from engine.store.commands import format_runs

    base = {"id": "r1", "started_at": 0.0, "num_steps": 3, "num_requests": 0, "kind": "attached",
            "label": "prod pods", "config": {"model_name": "prod pods", "pods": [{}, {}]}}
    for model in (None, "prod pods"):  # new rows, and rows recorded with the label as model
        row = format_runs([{**base, "model": model}]).splitlines()[1].split()
        assert row[-6:] == ["attached,", "2", "pod(s)", "-", "prod", "pods"]


def test_kvscope_miss_causes_are_read_by_cause_label():
    text = ("# TYPE kvscope_prefix_cache_misses counter\n"
            'kvscope_prefix_cache_misses_total{cause="cold"} 40\n'
            'kvscope_prefix_cache_misses_total{cause="evicted"} 8\n'
            'kvscope_prefix_cache_misses_total{cause="partial"} 3\n'
            'kvscope_prefix_cache_misses_total{cause="disabled"} 100\n')
    fold = ScrapeFold()
    fold.add(read_sample(text))
    fold.add(read_sample(text.replace(" 40", " 52").replace(" 3\n", " 7\n")))
    f = fold.figures()  # increases since the attach, one cause each
    assert (f["prefix_cache_miss_cold"], f["prefix_cache_miss_evicted"], f["prefix_cache_miss_partial"]) == (12, 0, 4)
    assert "prefix_cache_miss_disabled" not in f


def test_token_usage_on_the_fleet_page_exact_or_the_bound_the_stream_allows():
    """Issue 31 item 6 on an attached pod. A vLLM pod of 17 blocks (16 usable: the null block
    is never handed out) at 50% block usage whose events say it holds 10 stored full blocks
    (one hash in two copies): at most 8 of them are free, so at least 2 referenced blocks are
    full, and token usage lies in [2/16, 8/16]. A kvscope pod exports its token usage exactly;
    a pod whose stream lost a batch, or that exports no pool size, gets no figure."""
    from engine.attach.fleet import overview, pod_row

    text = ('# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.5\n'
            '# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="17"} 1.0\n')
    fold = ScrapeFold()
    fold.add(read_sample(text))
    scraped = fold.figures()
    assert (scraped["kv_cache_usage"], scraped["num_gpu_blocks"]) == (0.5, 17)
    s = HashCacheState()
    hashes = [f"{i:02x}" for i in range(1, 10)]
    s.apply_events([stored(1, "v", hashes, None), stored(2, "v", ["09"], "08"),  # 09 recomputed
                    stored(3, "v", ["ff"], None, medium="CPU")])  # an offloaded copy: not the pool's
    row = pod_row({"received": 3}, s.pods["v"], None)
    assert row["gpu_stored_copies"] == 10
    (got,) = overview({"v": dict(row, scraped=scraped)}, 0.0)
    assert (got["token_usage_low"], got["token_usage_high"]) == (2 / 16, 8 / 16)
    (lossy,) = overview({"v": dict(row, scraped=scraped, lost_batches=1, completeness=0.75)}, 0.0)
    assert (lossy["token_usage_low"], lossy["token_usage_high"]) == (None, None)
    no_size = {k: v for k, v in scraped.items() if k != "num_gpu_blocks"}
    (blind,) = overview({"v": dict(row, scraped=no_size)}, 0.0)
    assert blind["token_usage_low"] is None
    exact = read_sample(text + "# TYPE kvscope_kv_token_usage gauge\nkvscope_kv_token_usage 0.1875\n")
    (kv,) = overview({"v": dict(row, scraped=dict(exact.gauges))}, 0.0)
    assert (kv["token_usage_low"], kv["token_usage_high"]) == (0.1875, 0.1875)

"""The /metrics registry fed with hand-built steps: vLLM's names, types, labels, buckets, exact values."""

import math

import pytest

from engine.events.metrics.request_stats import FinishedRequestStats, FirstTokenStats
from engine.events.schema import types as event_types
from engine.events.schema.step import StepRecord
from engine.server.metrics import buckets
from engine.server.metrics.prom import ServerMetrics
from tests.server.prom_samples import Samples

M = "served-tiny"
CONFIG = {"block_size": 4, "num_blocks": 64, "max_model_len": 64, "enable_prefix_caching": True,
          "gpu_memory_utilization": 0.9, "num_kv_blocks": 64, "kv_cache_memory": None}


def registry(config=CONFIG):
    reg = ServerMetrics(M)
    reg.watch_config(lambda: config)
    return reg


def finished(rid, reason="length", prompt=10, gen=6, cached=4, n=1, max_tokens=6, **kw):
    times = dict(e2e_s=0.9, queued_s=0.1, prefill_s=0.2, decode_s=0.5, inference_s=0.7,
                 mean_time_per_output_token_s=0.1)
    times.update(kw)
    return FinishedRequestStats(rid, reason, prompt, gen, gen // n, n, max_tokens, cached,
                                prompt - cached, **times).to_dict()


def step(seq, ts=0.0, events=(), **metrics):
    return StepRecord(seq, seq, ts, list(events), metrics)


def samples(reg) -> Samples:
    return Samples(reg.render().decode())


def test_every_series_carries_model_name_and_engine_and_vllm_types():
    s = samples(registry())
    assert s.all and all(x.labels["engine"] == "0" for x in s.all)
    # as vLLM's: every series has model_name except cache_config_info (its CacheConfig's fields only)
    assert all(x.labels["model_name"] == M for x in s.all if x.name != "vllm:cache_config_info")
    assert "model_name" not in s.named("vllm:cache_config_info")[0].labels
    types = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting_by_reason": "gauge",
             "vllm:kv_cache_usage_perc": "gauge", "vllm:cache_config_info": "gauge",
             "vllm:prompt_tokens": "counter", "vllm:prompt_tokens_by_source": "counter",
             "vllm:prompt_tokens_cached_by_source": "counter", "vllm:request_num_preemptions": "histogram",
             "vllm:request_success": "counter", "vllm:num_preemptions": "counter",
             "vllm:iteration_tokens_total": "histogram", "vllm:request_params_n": "histogram",
             "vllm:kv_block_reuse_gap_seconds": "histogram", "kvscope_evictions": "counter",
             "kvscope_prefix_cache_misses": "counter", "kvscope_internal_fragmentation": "gauge"}
    for name, kind in types.items():
        assert s.types[name] == kind, name
    assert s.helps["vllm:num_requests_running"] == "Number of requests in model execution batches."
    assert s.helps["vllm:request_queue_time_seconds"] == "Histogram of time spent in WAITING phase for request."
    # label children vLLM creates up front are exposed at 0 before any request
    assert {x.labels["finished_reason"] for x in s.named("vllm:request_success_total")} == {
        "stop", "length", "abort", "error", "repetition"}
    assert {x.labels["source"] for x in s.named("vllm:prompt_tokens_cached_by_source_total")} == {
        "device", "host", "p2p", "disk", "external_unspecified"}
    assert {x.labels["reason"] for x in s.named("kvscope_evictions_total")} == {"reuse", "reset", "rollback"}


def test_buckets_are_vllms():
    s = samples(registry())
    assert s.buckets("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50]  # 1-2-5 up to max_model_len 64
    for name in ("request_generation_tokens", "request_max_num_generation_tokens",
                 "request_params_max_tokens", "request_prefill_kv_computed_tokens"):
        assert s.buckets(f"vllm:{name}") == [1, 2, 5, 10, 20, 50], name
    assert s.buckets("vllm:iteration_tokens_total") == list(buckets.ITERATION_TOKENS)
    assert s.buckets("vllm:request_params_n") == [1, 2, 5, 10, 20]
    assert s.buckets("vllm:request_num_preemptions") == [1, 2, 3, 4, 5, 10, 20]
    assert s.buckets("vllm:time_to_first_token_seconds")[:3] == [0.001, 0.005, 0.01]
    assert s.buckets("vllm:time_to_first_token_seconds")[-1] == 2560.0
    assert s.buckets("vllm:inter_token_latency_seconds") == list(buckets.INTER_TOKEN_LATENCY)
    assert s.buckets("vllm:request_time_per_output_token_seconds") == list(buckets.INTER_TOKEN_LATENCY)
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds"):
        assert s.buckets(f"vllm:{name}") == list(buckets.REQUEST_LATENCY), name
    assert s.buckets("vllm:kv_block_lifetime_seconds")[0] == 0.001
    assert s.buckets("vllm:kv_block_idle_before_evict_seconds")[-1] == 1800
    assert buckets.build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert buckets.build_1_2_5_buckets(2048)[-3:] == [500, 1000, 2000]
    with pytest.raises(ValueError):
        buckets.build_1_2_5_buckets(0)


def test_cache_config_info_labels_as_vllm_names_them():
    (info,) = samples(registry()).named("vllm:cache_config_info")
    assert info.value == 1
    # vLLM 0.32's label set (its CacheConfig's fields, tests/vllm/test_metrics.py checks it on a
    # real vllm serve); the features kvscope lacks at vLLM's values with them off
    assert info.labels == {
        "engine": "0", "block_size": "4", "user_specified_block_size": "True",
        "_block_size_resolved": "True", "cache_dtype": "auto", "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9", "is_attention_free": "False",
        "num_gpu_blocks": "64", "num_gpu_blocks_override": "64", "num_cpu_blocks": "None",
        "kv_cache_memory_bytes": "None", "prefix_caching_hash_algo": "sha256", "sliding_window": "None",
        "kv_cache_size_tokens": "256", "kv_cache_max_concurrency": "4.0", "hash_block_size": "4",
        "cache_hit_alignment_tokens": "4", "effective_attention_block_size": "4",
        "kv_cache_layout": "None", "prefix_match_unit": "None", "prefix_cache_retention_interval": "0",
        "kv_cache_dtype_skip_layers": "[]", "mamba_page_size_padded": "None",
        "skip_page_size_padded": "None", "mamba_block_size": "None", "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": "False", "replayssm_buffer_len": "16",
        "use_replayssm": "False", "use_kda_recoverssm": "False", "kv_sharing_fast_prefill": "False",
        "swa_bounded_replay": "True", "kv_offloading_size": "None", "kv_offloading_backend": "native"}


def test_exact_values_from_steps():
    reg = registry()
    first = [FirstTokenStats("a", 10, 0, 0.02).to_dict(), FirstTokenStats("b", 9, 4, 0.3).to_dict()]
    reg.observe_step(step(0, num_requests_running=2, num_requests_waiting=1, num_requests_preempted=2,
                          kv_cache_usage=0.25, kv_token_usage=0.2, internal_fragmentation=0.1,
                          prefix_cache_queries_step=19, prefix_cache_hits_step=4,
                          prefix_cache_miss_cold_step=12, prefix_cache_miss_partial_step=3,
                          num_preemptions_step=1, num_output_tokens_step=2, num_batched_tokens=15,
                          num_prefill_tokens=15, cow_copies_step=1, ttft_s=[0.02, 0.3], first_tokens=first))
    reg.observe_step(step(1, num_requests_running=0, num_requests_waiting=0, kv_cache_usage=0.0,
                          num_output_tokens_step=2, num_batched_tokens=2, itl_s=[0.05, 0.07],
                          finished_requests=[finished("a", prompt=10, cached=0, gen=2),
                                             finished("b", "stop", prompt=9, cached=4, gen=8, n=2,
                                                      max_tokens=None, queued_s=None,
                                                      mean_time_per_output_token_s=None,
                                                      num_preemptions=3)]))
    reg.observe_step(step(2))  # a step that ran nothing: no iteration observation
    s = samples(reg)
    assert s.get("vllm:num_requests_running") == 0 and s.get("vllm:kv_cache_usage_perc") == 0
    assert s.get("vllm:prompt_tokens_total") == 19
    assert s.get("vllm:prompt_tokens_by_source_total", source="local_compute") == 15
    assert s.get("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 4
    assert s.get("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert s.get("vllm:prompt_tokens_cached_total") == 4
    assert not s.named("vllm:prompt_tokens_recomputed_total")  # not a vLLM 0.32 metric
    assert s.get("vllm:prefix_cache_queries_total") == 19 and s.get("vllm:prefix_cache_hits_total") == 4
    assert s.get("vllm:prompt_tokens_cached_by_source_total", source="device") == 4
    assert s.get("vllm:prompt_tokens_cached_by_source_total", source="host") == 0
    assert s.get("vllm:num_preemptions_total") == 1 and s.get("vllm:generation_tokens_total") == 4
    assert s.get("vllm:request_success_total", finished_reason="length") == 1
    assert s.get("vllm:request_success_total", finished_reason="stop") == 1
    assert s.get("vllm:request_success_total", finished_reason="abort") == 0
    # vLLM's per-step tokens: generated tokens + the first tokens' uncached prompts (10 + 5),
    # not the 15 scheduled: step 0 observes 2 + 15 = 17, step 1 its 2 decode tokens
    assert s.get("vllm:iteration_tokens_total_count") == 2 and s.get("vllm:iteration_tokens_total_sum") == 19
    assert s.get("vllm:iteration_tokens_total_bucket", le="8.0") == 1
    assert s.get("vllm:iteration_tokens_total_bucket", le="16.0") == 1
    assert s.get("vllm:iteration_tokens_total_bucket", le="32.0") == 2
    assert s.get("vllm:request_num_preemptions_count") == 2 and s.get("vllm:request_num_preemptions_sum") == 3
    assert s.get("vllm:request_num_preemptions_bucket", le="1.0") == 1  # 0 shares vLLM's first bucket
    assert s.get("vllm:request_num_preemptions_bucket", le="3.0") == 2
    assert s.get("vllm:time_to_first_token_seconds_count") == 2
    assert s.get("vllm:time_to_first_token_seconds_sum") == pytest.approx(0.32)
    assert s.get("vllm:time_to_first_token_seconds_bucket", le="0.04") == 1
    assert s.get("vllm:inter_token_latency_seconds_count") == 2
    assert s.get("vllm:request_prompt_tokens_sum") == 19 and s.get("vllm:request_prompt_tokens_count") == 2
    assert s.get("vllm:request_prompt_tokens_bucket", le="10.0") == 2
    assert s.get("vllm:request_generation_tokens_sum") == 10
    assert s.get("vllm:request_max_num_generation_tokens_sum") == 6  # 2 + the longest of 2 x 4
    assert s.get("vllm:request_params_n_sum") == 3 and s.get("vllm:request_params_n_bucket", le="1.0") == 1
    assert s.get("vllm:request_params_max_tokens_count") == 1  # b asked for no max_tokens
    assert s.get("vllm:request_prefill_kv_computed_tokens_sum") == 15
    assert s.get("vllm:e2e_request_latency_seconds_count") == 2
    assert s.get("vllm:request_queue_time_seconds_count") == 1  # b was never queued (None)
    for phase in ("prefill", "decode", "inference"):
        assert s.get(f"vllm:request_{phase}_time_seconds_count") == 2, phase
    assert s.get("vllm:request_decode_time_seconds_sum") == pytest.approx(1.0)
    assert s.get("vllm:request_time_per_output_token_seconds_count") == 2  # b's None is vLLM's 0
    assert s.get("vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.1)
    # waiting counts the preempted, as vLLM's waiting queue holds them; nothing is deferred
    reg.observe_step(step(3, num_requests_running=1, num_requests_waiting=1, num_requests_preempted=2))
    s = samples(reg)
    assert s.get("vllm:num_requests_waiting") == 3
    assert s.get("vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert s.get("vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    assert s.get("kvscope_cow_copies_total") == 1 and s.get("kvscope_steps_total") == 4
    assert s.get("kvscope_prefix_cache_misses_total", cause="cold") == 12
    assert s.get("kvscope_internal_fragmentation") == pytest.approx(0.1)
    reg.errors.labels("bad_params").inc()  # as the hub counts the errors it sends
    assert samples(reg).get("kvscope_ws_errors_total", code="bad_params") == 1


def test_block_residency_and_evictions_from_events():
    reg = registry()
    reg.observe_step(step(0, 100.0, [event_types.BlockAllocated(0, 1, "a", 0), event_types.BlockAllocated(0, 2, "a", 1)]))
    reg.observe_step(step(1, 101.0, [event_types.PrefixHit(1, "b", (1,), 4)]))
    reg.observe_step(step(2, 103.0, [event_types.PrefixHit(2, "c", (1,), 4)]))
    reg.observe_step(step(3, 104.5, [event_types.BlockEvicted(3, 1, "h1"), event_types.BlockAllocated(3, 1, "d", 0),
                                     event_types.BlockAllocated(3, 2, "d", 1)]))
    s = samples(reg)
    assert s.get("vllm:kv_block_lifetime_seconds_count") == 2
    assert s.get("vllm:kv_block_lifetime_seconds_sum") == pytest.approx(4.5 + 4.5)
    assert s.get("vllm:kv_block_idle_before_evict_seconds_sum") == pytest.approx(1.5 + 4.5)
    assert s.get("vllm:kv_block_reuse_gap_seconds_count") == 1
    assert s.get("vllm:kv_block_reuse_gap_seconds_sum") == pytest.approx(2.0)
    assert s.get("vllm:kv_block_reuse_gap_seconds_bucket", le="2.0") == 1
    assert s.get("kvscope_evictions_total", reason="reuse") == 1
    # a new run (restart) starts a new pool: no tenure carries over
    reg.start_run(CONFIG)
    reg.observe_step(step(0, 200.0, [event_types.BlockAllocated(0, 1, "e", 0)]))
    assert samples(reg).get("vllm:kv_block_lifetime_seconds_count") == 2


def test_a_restart_with_another_max_model_len_gets_its_buckets_and_labels():
    reg = registry()
    reg.observe_step(step(0, finished_requests=[finished("a", prompt=30)]))
    reg.start_run({**CONFIG, "max_model_len": 200, "block_size": 8, "num_blocks": 10})
    s = samples(reg)
    assert s.buckets("vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200]
    assert s.get("vllm:request_prompt_tokens_count") == 0  # new buckets, new counts (a reset)
    assert s.get("vllm:request_success_total", finished_reason="length") == 1  # counters go on
    (info,) = s.named("vllm:cache_config_info")
    assert info.labels["block_size"] == "8" and info.labels["kv_cache_max_concurrency"] == "0.4"


def test_nothing_token_shaped_before_the_engine_is_loaded():
    reg = registry(config={})  # still loading: no max_model_len yet
    s = samples(reg)
    assert not s.named("vllm:request_prompt_tokens_count") and not s.named("vllm:cache_config_info")
    assert s.get("vllm:num_requests_running") == 0 and math.isfinite(s.get("vllm:prompt_tokens_total"))


def test_cache_config_info_names_the_configured_kv_cache_dtype():
    from engine.server.metrics.cache_config import cache_config_labels

    base = {"block_size": 16, "num_blocks": 10, "max_model_len": 64}
    assert cache_config_labels(base)["cache_dtype"] == "auto"
    assert cache_config_labels({**base, "kv_cache_dtype": "bfloat16"})["cache_dtype"] == "bfloat16"

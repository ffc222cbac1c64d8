"""/metrics on a live server: vLLM's names with both labels, what vLLM's dashboards query,
exact values after a known workload, and the plain text format whatever the scraper asks."""

import http.client

from engine.cli import build_parser
from engine.client import KVScopeClient
from engine.config import EngineConfig
from engine.events.schema.step import StepRecord
from engine.server.app import ServerOptions
from tests.server.helpers import GREEDY, raw, recv_until, send
from tests.server.prom_samples import scrape

SERVED = "kvscope-tiny"

VLLM = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count")

# Every metric name that vLLM's two Grafana dashboards query, as they query it (histograms by
# _bucket/_sum/_count), read from vllm-project/vllm's
# examples/observability/prometheus_grafana/grafana.json (commit 4b5c627) and
# examples/observability/dashboards/grafana/vllm_kv_cache.json (commit 5836216). Left out: the
# panels that need a KV connector, NIXL, an offloading connector or a multimodal model
# (vllm:external_prefix_cache_*, vllm:mm_cache_*, vllm:num_requests_kv_fetch_by_stage,
# vllm:nixl_*, vllm:kv_offload_*, vllm:simple_kv_offload_*), which one local engine has not.
DASHBOARD_NAMES = (
    # grafana.json (filters model_name)
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
    # vllm_kv_cache.json (filters job, model_name, instance, engine)
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
    "vllm:prompt_tokens_cached_total", "vllm:num_preemptions_total",
    "vllm:num_requests_waiting_by_reason", "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_by_source_total",
    "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count",
    "vllm:request_prefill_kv_computed_tokens_sum", "vllm:request_prefill_kv_computed_tokens_count",
    "vllm:kv_block_lifetime_seconds_bucket", "vllm:kv_block_lifetime_seconds_sum",
    "vllm:kv_block_lifetime_seconds_count",
    "vllm:kv_block_idle_before_evict_seconds_bucket", "vllm:kv_block_idle_before_evict_seconds_sum",
    "vllm:kv_block_idle_before_evict_seconds_count",
    "vllm:kv_block_reuse_gap_seconds_bucket", "vllm:kv_block_reuse_gap_seconds_sum",
    "vllm:kv_block_reuse_gap_seconds_count",
)
# The label values those panels select (reason="capacity", source="local_compute", ...).
DASHBOARD_LABEL_VALUES = {
    "vllm:num_requests_waiting_by_reason": ("reason", {"capacity", "deferred"}),
    "vllm:prompt_tokens_by_source_total": ("source", {"local_compute", "local_cache_hit",
                                                      "external_kv_transfer"}),
    "vllm:request_success_total": ("finished_reason", {"stop", "length", "abort"}),
}


def _flat(samples) -> dict:
    """name{label=value}... -> value, with model_name and engine checked and left out
    (cache_config_info has no model_name, as vLLM's)."""
    out = {}
    for s in samples.all:
        assert s.name == "vllm:cache_config_info" or s.labels.pop("model_name"), s
        assert s.labels.pop("engine") == "0", s
        key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
        out[key] = s.value
    return out


def _all_steps(c: KVScopeClient) -> list[StepRecord]:
    """Every step message of the (now idle) server: replies overtake steps, so read until quiet."""
    while c.poll(0.3):
        pass
    return c.drain_steps()


def test_metrics_parse_and_counters_move(make_server):
    server = make_server()
    before = _flat(scrape(server.port))
    for name in VLLM:
        assert name in before, name
    assert "kvscope_prefix_cache_misses_total{cause=cold}" in before
    assert before["kvscope_num_blocks"] == 64
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("the same prompt, twice", params=GREEDY)
        c.generate("the same prompt, twice", params=GREEDY)
        after = _flat(scrape(server.port))
        assert after["kvscope_ws_connections"] == 1
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:prefix_cache_hits_total"] > 0
    assert after["kvscope_prefix_cache_misses_total{cause=cold}"] > 0
    assert after["vllm:time_to_first_token_seconds_count"] == 2
    assert after["vllm:inter_token_latency_seconds_count"] == 10  # 2 x (6 tokens - 1)
    assert after["vllm:generation_tokens_total"] == 12
    assert after["kvscope_steps_total"] > 0 and after["kvscope_requests_finished_total"] == 2


def test_every_name_the_dashboards_query_is_there_with_both_labels(make_server):
    server = make_server(served_model_name=SERVED)
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("a prompt the dashboards will see", params=GREEDY)
        c.generate("a prompt the dashboards will see", params=GREEDY)
        c.generate(messages=[{"role": "user", "content": "hi"}],
                   params={"n": 2, "temperature": 1.0, "seed": 1, "max_tokens": 3, "ignore_eos": True})
    s = scrape(server.port)
    for name in DASHBOARD_NAMES:
        found = s.named(name)
        assert found, f"{name} is missing"
        for x in found:
            assert x.labels.get("model_name") == SERVED and x.labels.get("engine") == "0", x
    for name, (label, values) in DASHBOARD_LABEL_VALUES.items():
        assert values <= {x.labels[label] for x in s.named(name)}, name
    assert s.get("vllm:kv_cache_usage_perc", model_name=SERVED, engine="0") >= 0
    assert {x.labels["model_name"] for x in s.all if x.name != "vllm:cache_config_info"} == {SERVED}


def test_exact_values_after_a_known_workload(make_server):
    server = make_server(served_model_name=SERVED)
    prompts = ["one prompt about the sea", "one prompt about the sea", "and another about hills"]
    with KVScopeClient(server.url, timeout=30) as c:
        fins = [c.generate(p, params=GREEDY) for p in prompts]
    prompt_tokens = sum(f.metrics["num_prompt_tokens"] for f in fins)
    hits = sum(f.metrics["num_cached_tokens"] for f in fins)
    assert hits > 0  # the repeated prompt hit its full blocks
    n, gen = len(prompts), GREEDY["max_tokens"]
    s = scrape(server.port)
    assert s.get("vllm:prompt_tokens_total") == prompt_tokens
    assert s.get("vllm:prefix_cache_queries_total") == prompt_tokens  # one lookup per admission
    assert s.get("vllm:prefix_cache_hits_total") == hits
    assert s.get("vllm:prompt_tokens_cached_total") == hits
    assert s.get("vllm:prompt_tokens_cached_by_source_total", source="device") == hits
    assert s.get("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == hits
    assert s.get("vllm:prompt_tokens_by_source_total", source="local_compute") == prompt_tokens - hits
    assert s.get("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert s.get("vllm:num_preemptions_total") == 0
    assert s.get("vllm:request_num_preemptions_count") == n and s.get("vllm:request_num_preemptions_sum") == 0
    assert s.get("vllm:generation_tokens_total") == n * gen
    assert s.get("vllm:request_success_total", finished_reason="length") == n
    assert s.get("vllm:request_success_total", finished_reason="stop") == 0
    assert s.get("vllm:request_prompt_tokens_count") == n
    assert s.get("vllm:request_prompt_tokens_sum") == prompt_tokens
    assert s.get("vllm:request_generation_tokens_sum") == n * gen
    assert s.get("vllm:request_max_num_generation_tokens_sum") == n * gen
    assert s.get("vllm:request_params_max_tokens_sum") == n * gen
    assert s.get("vllm:request_params_n_sum") == n
    assert s.get("vllm:request_prefill_kv_computed_tokens_sum") == prompt_tokens - hits
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "request_time_per_output_token_seconds"):
        assert s.get(f"vllm:{name}_count") == n, name
    assert s.get("vllm:inter_token_latency_seconds_count") == n * (gen - 1)
    # vLLM's per-step tokens: every generated token, and each uncached prompt token once (at
    # its request's first token); the scheduled tokens are the same less the n first tokens
    assert s.get("vllm:iteration_tokens_total_sum") == prompt_tokens - hits + n * gen
    assert s.get("vllm:iteration_tokens_total_count") == n * gen  # one at a time: a token a step
    assert s.get("kvscope_prefill_tokens_total") + s.get("kvscope_decode_tokens_total") + n == (
        s.get("vllm:iteration_tokens_total_sum"))
    assert s.get("vllm:num_requests_running") == 0 and s.get("vllm:num_requests_waiting") == 0
    assert s.get("vllm:kv_cache_usage_perc") == 0  # all freed; cached blocks count as free
    assert s.get("vllm:cache_config_info", block_size="4", num_gpu_blocks="64") == 1


def test_preemptions_and_block_residency_match_the_event_stream(make_server):
    # 12 blocks of 4 tokens: three 20-token prompts growing by 8 tokens (7 blocks each) cannot all fit,
    # so requests are preempted and blocks are handed out again and again.
    server = make_server(engine={"num_kv_blocks": 12, "max_model_len": 32, "max_num_batched_tokens": 64})
    params = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}
    with KVScopeClient(server.url, timeout=60) as c:
        # sent without waiting for each accepted, so the three run together however long
        # a round trip to the engine takes (a thread's or a process's)
        ws = raw(server.url)
        for i in range(3):
            send(ws, type="submit", prompt=list(range(10 * i + 1, 10 * i + 21)), params=params,
                 request_id=f"p{i}")
        finished = set()
        while len(finished) < 3:
            finished.add(recv_until(ws, lambda m: m["type"] == "finished")[0]["request_id"])
        ws.close()
        c.generate(list(range(1, 21)), params=params)  # the first prompt again
        steps = _all_steps(c)
    assert [st.seq for st in steps] == list(range(len(steps)))
    preempted = sum(e.type == "request_preempted" for st in steps for e in st.events)
    assert preempted > 0
    handed, lifetimes = {}, []  # an independent fold: block -> ts of its last hand-out
    for st in steps:
        for e in st.events:
            block = e.block if e.type == "block_allocated" else (
                e.dst if e.type == "cow_copy" else None)
            if block is not None:
                if block in handed:
                    lifetimes.append(st.ts - handed[block])
                handed[block] = st.ts
    assert lifetimes
    s = scrape(server.port)
    assert s.get("vllm:num_preemptions_total") == preempted
    # per finished request, as vLLM's: the three and the repeat, their preemptions summed
    assert s.get("vllm:request_num_preemptions_count") == 4
    assert s.get("vllm:request_num_preemptions_sum") == preempted
    assert s.get("vllm:kv_block_lifetime_seconds_count") == len(lifetimes)
    assert abs(s.get("vllm:kv_block_lifetime_seconds_sum") - sum(lifetimes)) < 1e-6
    assert s.get("vllm:kv_block_idle_before_evict_seconds_count") == len(lifetimes)
    assert s.get("vllm:kv_block_idle_before_evict_seconds_sum") <= s.get("vllm:kv_block_lifetime_seconds_sum")


def test_prefix_cache_reset_counts_evictions_by_reason(make_server):
    server = make_server()
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("twelve tokens or so, to fill some blocks", params=GREEDY)
        cached = sum(e.type == "block_cached" for st in _all_steps(c) for e in st.events)
        assert c.reset_prefix_cache().result["num_blocks_reset"] == cached > 0
        c.generate("x", params=GREEDY)  # a step after the reset publishes its events
    s = scrape(server.port)
    assert s.get("kvscope_evictions_total", reason="reset") == cached
    assert s.get("kvscope_evictions_total", reason="reuse") == 0
    assert s.get("kvscope_prefix_cache_resets_total") == 1


def test_plain_text_format_even_when_openmetrics_is_asked(make_server):
    server = make_server()
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
              "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # what Prometheus 2.x sends
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept": accept})
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE vllm:prompt_tokens_total counter" in body and "vllm_prompt_tokens" not in body
    assert "vllm:kv_cache_usage_perc{" in body and "# EOF" not in body
    assert scrape(server.port, {"Accept": accept}).named("vllm:num_requests_running")


def test_served_model_name_option():
    args = build_parser().parse_args(["serve", "--served-model-name", "a", "b"])
    assert args.served_model_name == ["a", "b"]
    assert build_parser().parse_args(["serve"]).served_model_name is None
    cfg = EngineConfig(model="some/model")
    assert ServerOptions(cfg, served_model_name=("a", "b")).model_name == "a"
    assert ServerOptions(cfg, served_model_name="one").served_model_name == ("one",)
    assert ServerOptions(cfg).model_name == "some/model"  # vLLM's default: the model argument
    for bad in (("",), (None,)):
        try:
            ServerOptions(cfg, served_model_name=bad)
        except ValueError as exc:
            assert "served_model_name" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")

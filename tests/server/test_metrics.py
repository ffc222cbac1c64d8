"""/metrics is Prometheus text with vLLM's names, and its counters move."""

from prometheus_client.parser import text_string_to_metric_families

from engine.client import KVScopeClient
from tests.server.helpers import GREEDY, http_get

VLLM = ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count")


def _samples(port: int) -> dict:
    status, text = http_get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def test_metrics_parse_and_counters_move(make_server):
    server = make_server()
    before = _samples(server.port)
    for name in VLLM:
        assert name in before, name
    assert "kvscope_prefix_cache_misses_total{cause=cold}" in before
    assert before["kvscope_num_blocks"] == 64
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("the same prompt, twice", params=GREEDY)
        c.generate("the same prompt, twice", params=GREEDY)
        after = _samples(server.port)
        assert after["kvscope_ws_connections"] == 1
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:prefix_cache_hits_total"] > 0
    assert after["kvscope_prefix_cache_misses_total{cause=cold}"] > 0
    assert after["vllm:time_to_first_token_seconds_count"] == 2
    assert after["vllm:inter_token_latency_seconds_count"] == 10  # 2 x (6 tokens - 1)
    assert after["vllm:generation_tokens_total"] == 12
    assert after["kvscope_steps_total"] > 0 and after["kvscope_requests_finished_total"] == 2

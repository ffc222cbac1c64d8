"""vLLM's histogram buckets (``vllm/v1/metrics/buckets.py``, vLLM 0.32), so kvscope's
histograms line up bucket for bucket with vLLM's dashboards and alerts."""

from __future__ import annotations

REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)  # vLLM's: never preempted shares the first bucket
KV_CACHE_RESIDENCY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60,
                      120, 300, 600, 1200, 1800)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's request-token buckets, capped at
    max_model_len): ``build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]``."""
    if not isinstance(max_value, int) or max_value < 1:
        raise ValueError(f"max_value must be a positive integer, got {max_value!r}")
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10

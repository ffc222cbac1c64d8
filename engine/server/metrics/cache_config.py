"""``vllm:cache_config_info``: the cache settings as labels, named as vLLM names them.

vLLM labels the gauge with every field of its ``CacheConfig`` as ``str(value)``
(``CacheConfig.metrics_info`` in ``vllm/config/cache.py``) plus ``engine``. kvscope
exports the fields that mean something for its pool, with the same names and the
same Python ``str`` spelling (``True``, ``None``); ``model_name`` is added as on every
kvscope series (vLLM leaves it off this one).
"""

from __future__ import annotations

from typing import Any

HELP = "Information of the LLMEngine CacheConfig"


def cache_config_labels(config: dict[str, Any]) -> dict[str, str]:
    """Labels for one run, from its effective config (``LLMEngine.describe()``)."""
    block_size = int(config["block_size"])
    num_blocks = int(config["num_blocks"])
    max_model_len = int(config["max_model_len"])
    blocks_per_request = -(-max_model_len // block_size)
    values: dict[str, Any] = {
        "block_size": block_size,
        # The KV cache always has the model's dtype: vLLM's "auto".
        "cache_dtype": "auto",
        "enable_prefix_caching": bool(config.get("enable_prefix_caching", True)),
        "gpu_memory_utilization": config.get("gpu_memory_utilization"),
        "is_attention_free": False,
        # kvscope's pool, on CPU as on CUDA, under vLLM's name for it.
        "num_gpu_blocks": num_blocks,
        "num_gpu_blocks_override": config.get("num_kv_blocks"),
        "num_cpu_blocks": None,
        "kv_cache_memory_bytes": config.get("kv_cache_memory"),
        "prefix_caching_hash_algo": config.get("prefix_caching_hash_algo", "sha256"),  # engine.core.hashing
        "sliding_window": None,
        "kv_cache_size_tokens": num_blocks * block_size,
        # vLLM: num_blocks / blocks one max_model_len request needs (a float).
        "kv_cache_max_concurrency": num_blocks / blocks_per_request,
        "hash_block_size": block_size,
        "cache_hit_alignment_tokens": block_size,
        "effective_attention_block_size": block_size,
    }
    return {k: str(v) for k, v in values.items()}


LABEL_NAMES = tuple(cache_config_labels({"block_size": 1, "num_blocks": 1, "max_model_len": 1}))

"""``vllm:cache_config_info``: the cache settings as labels, named as vLLM names them.

vLLM 0.32 labels the gauge with every field of its ``CacheConfig`` as ``str(value)``
(``CacheConfig.metrics_info`` in ``vllm/config/cache.py``: ``self.__dict__``, private
``_block_size_resolved`` included) plus ``engine``, and no ``model_name``. kvscope emits
the same label set (tests/vllm/test_metrics.py compares it with a real ``vllm serve``),
in the same Python ``str`` spelling (``True``, ``None``, ``[]``), with values true for
kvscope's pool:

- what kvscope has: its block size, prefix caching, hash algorithm, memory settings,
  pool size and what follows from it (``kv_cache_size_tokens``, ``kv_cache_max_concurrency``);
  ``hash_block_size`` and ``cache_hit_alignment_tokens`` are the block size (vLLM's API
  process reports ``None``: its engine core sets them, in another process);
- ``num_gpu_blocks`` is kvscope's pool, on CPU as on CUDA, under vLLM's name. vLLM's
  counts its null block (a 64-usable-block vLLM pool says 65; kvscope's says 64);
- what kvscope does not have (mamba/SSM state, KV offloading, KV sharing, sliding
  windows, prefix retention, a finer prefix-match unit, a vLLM KV layout): the value
  vLLM shows with the feature off (``None``, ``False``, its defaults).
"""

from __future__ import annotations

from typing import Any

HELP = "Information of the LLMEngine CacheConfig"

# vLLM's CacheConfig fields for features kvscope does not have, at vLLM's "off"/default
# values (vllm/config/cache.py). mamba_ssm_cache_dtype: vLLM's CPU platform resets it to
# float32 (for its GDN backend); kvscope keeps no SSM state, so vLLM's default "auto".
_ABSENT_FEATURES: dict[str, Any] = {
    "kv_cache_layout": None,
    "prefix_match_unit": None,
    "prefix_cache_retention_interval": 0,
    "kv_cache_dtype_skip_layers": [],
    "mamba_page_size_padded": None,
    "skip_page_size_padded": None,
    "mamba_block_size": None,
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": False,
    "replayssm_buffer_len": 16,
    "use_replayssm": False,
    "use_kda_recoverssm": False,
    "num_cpu_blocks": None,
    "kv_sharing_fast_prefill": False,
    "swa_bounded_replay": True,
    "kv_offloading_size": None,
    "kv_offloading_backend": "native",
    "sliding_window": None,
    "is_attention_free": False,
}


def cache_config_labels(config: dict[str, Any]) -> dict[str, str]:
    """Labels for one run, from its effective config (``LLMEngine.describe()``)."""
    block_size = int(config["block_size"])
    num_blocks = int(config["num_blocks"])
    max_model_len = int(config["max_model_len"])
    blocks_per_request = -(-max_model_len // block_size)
    values: dict[str, Any] = {
        "block_size": block_size,
        # kvscope never derives the block size from an attention backend: it is the configured one
        "user_specified_block_size": True,
        "_block_size_resolved": True,
        # vLLM's --kv-cache-dtype as configured ("auto": the model's dtype)
        "cache_dtype": config.get("kv_cache_dtype", "auto"),
        "gpu_memory_utilization": config.get("gpu_memory_utilization"),
        "num_gpu_blocks_override": config.get("num_kv_blocks"),
        "enable_prefix_caching": bool(config.get("enable_prefix_caching", True)),
        "prefix_caching_hash_algo": config.get("prefix_caching_hash_algo", "sha256"),  # engine.core.hashing
        "num_gpu_blocks": num_blocks,
        "effective_attention_block_size": block_size,
        "kv_cache_size_tokens": num_blocks * block_size,
        # vLLM: num_blocks / blocks one max_model_len request needs (a float).
        "kv_cache_max_concurrency": num_blocks / blocks_per_request,
        "hash_block_size": block_size,
        "cache_hit_alignment_tokens": block_size,
        "kv_cache_memory_bytes": config.get("kv_cache_memory"),
        **_ABSENT_FEATURES,
    }
    return {k: str(v) for k, v in values.items()}


LABEL_NAMES = tuple(cache_config_labels({"block_size": 1, "num_blocks": 1, "max_model_len": 1}))

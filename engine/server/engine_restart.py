"""Restart: a new engine with another pool or scheduler shape, on the loaded weights.

What a client may ask for is bounded here: the keys (``protocol.ops.RESTART_KEYS``)
are checked when the op is parsed, the values against the running engine and
the operator's limits below. Runs on the engine thread.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from engine.core import ConfigError
from engine.llm_engine import LLMEngine
from engine.startup import build_engine


def rebuild_engine(old: LLMEngine, options: dict[str, Any]) -> LLMEngine:
    """The engine ``old`` becomes with ``options``; raises (KVScopeError, TypeError,
    ValueError) and leaves ``old`` serving when they are refused."""
    cfg = dataclasses.replace(old.config, **options)
    check_restart(cfg, old)
    # Reuse the loaded weights: only the pool and the scheduler change. The new
    # pool is allocated before the old one is dropped, so a bad config leaves
    # the old engine serving (at the price of both pools for a moment).
    return build_engine(cfg, loaded=old.parts.loaded, kv_events=old.kv_events)  # one KV event stream


def check_restart(cfg: EngineConfig, old: LLMEngine) -> None:
    """Refuse restarts a client should not be able to ask for: a pool bigger than the
    operator's (or the 1 GiB CPU default) would let any client exhaust the host's
    memory, and positions past the model's own limit give garbage."""
    limit = old.spec.max_position_embeddings
    if cfg.max_model_len is not None and cfg.max_model_len > limit:
        raise ConfigError(f"max_model_len {cfg.max_model_len} exceeds the model's {limit} positions")
    if cfg.num_kv_blocks is not None:
        budget = max(old.cache_config.num_blocks * old.parts.kv_bytes_per_block, DEFAULT_CPU_KV_BYTES)
        per_block = old.spec.kv_bytes_per_block(cfg.block_size, old.parts.loaded.dtype)
        if cfg.num_kv_blocks * per_block > budget:
            raise ConfigError(f"{cfg.num_kv_blocks} blocks of {cfg.block_size} tokens need "
                              f"{cfg.num_kv_blocks * per_block} bytes; this server allows at most "
                              f"{budget} ({budget // per_block} blocks)")

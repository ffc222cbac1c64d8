"""Restart: a new core with another pool or scheduler shape, on the loaded weights.

What a client may ask for is bounded here: the keys (``protocol.ops.RESTART_KEYS``)
are checked when the op is parsed, the values against the operator's limits
(``RestartLimits``: what the core started with, kept across its restarts). Whether a
client may restart at all is the front door's and the engine worker's call
(``--no-client-restart``, the token). Runs in the core (``EngineCore.restart``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core import ConfigError
from engine.engine_core.messages import CoreInfo

if TYPE_CHECKING:
    from engine.engine_core.core import EngineCore


MIN_BLOCK_SIZE = 8  # smaller blocks multiply per-block bookkeeping for no teaching gain


@dataclass(frozen=True, slots=True)
class RestartLimits:
    """What a client's restart may ask for: never more than the operator started the
    server with. The core's first build's (``EngineCore.restart_limits``), not the running
    one's, so restarts cannot ratchet the limits up one after another."""

    pool_bytes: int  # the started KV pool, in bytes: a new pool may not be bigger
    num_blocks: int  # nor hold more blocks (their bookkeeping is per block, whatever their size)
    min_block_size: int  # MIN_BLOCK_SIZE, or the started block size when that is smaller
    max_num_seqs: int
    max_num_batched_tokens: int

    @classmethod
    def of(cls, info: CoreInfo) -> RestartLimits:
        d = info.describe
        return cls(d["num_blocks"] * d["kv_bytes_per_block"], d["num_blocks"], min(MIN_BLOCK_SIZE, d["block_size"]),
                   d["max_num_seqs"], d["max_num_batched_tokens"])


def rebuilt(old: EngineCore, options: dict[str, Any]) -> EngineCore:
    """The core ``old`` becomes with ``options``; raises (KVScopeError, TypeError,
    ValueError) and leaves ``old`` serving when they are refused.

    Refused: a pool bigger than the operator's, in bytes or in blocks (block_size 1 made
    2M blocks and blocked the engine for 19 s), and a scheduler wider than the operator's."""
    from engine.engine_core.startup import build_engine_core, resolve_kv_cache_dtype

    bounds = old.restart_limits
    cfg = dataclasses.replace(old.config, **options)
    loaded = old.loaded
    per_block = loaded.spec.kv_bytes_per_block(cfg.block_size, resolve_kv_cache_dtype(cfg.kv_cache_dtype, loaded))
    most = min(bounds.num_blocks, bounds.pool_bytes // per_block)  # blocks of this size the operator allows
    if cfg.num_kv_blocks is None:  # "the default" is what the operator's budget holds, never more
        cfg = dataclasses.replace(cfg, num_kv_blocks=most)
    if cfg.block_size < bounds.min_block_size:
        raise ConfigError(f"block_size {cfg.block_size} is below this server's minimum of "
                          f"{bounds.min_block_size}")
    if cfg.num_kv_blocks > most:
        raise ConfigError(f"{cfg.num_kv_blocks} blocks of {cfg.block_size} tokens need "
                          f"{cfg.num_kv_blocks * per_block} bytes; this server allows at most "
                          f"{bounds.pool_bytes} bytes and {bounds.num_blocks} blocks "
                          f"({most} blocks of {cfg.block_size} tokens)")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        value, limit = getattr(cfg, name), getattr(bounds, name)
        if value is not None and value > limit:
            raise ConfigError(f"{name} {value} is above this server's {limit}")
    # Reuse the loaded weights: only the pool and the scheduler change. The new
    # pool is allocated before the old one is dropped, so a bad config (one past the
    # model's positions too: build_engine_core's check) leaves the old core serving
    # (at the price of both pools for a moment).
    return build_engine_core(cfg, loaded=loaded)

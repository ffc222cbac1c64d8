"""Restart: a new core with another pool or scheduler shape, on the loaded weights.

What a client may ask for is bounded here: the keys (``protocol.ops.RESTART_KEYS``)
are checked when the op is parsed, the values against the operator's limits
(``RestartLimits``: what the server started with). Whether a client may restart
at all is the front door's and the engine worker's call (``--no-client-restart``,
the token). Runs in the core (``EngineCore.restart``); ``RestartLimits`` is plain
data the engine worker keeps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.core import ConfigError
from engine.engine_core.messages import CoreInfo

if TYPE_CHECKING:
    from engine.engine_core.core import EngineCore


MIN_BLOCK_SIZE = 8  # smaller blocks multiply per-block bookkeeping for no teaching gain


@dataclass(frozen=True, slots=True)
class RestartLimits:
    """What a client's restart may ask for: never more than the operator started the
    server with. Taken from the first engine (``of``), not from the one running, so
    restarts cannot ratchet the limits up one after another."""

    pool_bytes: int  # the started KV pool, in bytes: a new pool may not be bigger
    num_blocks: int  # nor hold more blocks (their bookkeeping is per block, whatever their size)
    min_block_size: int  # MIN_BLOCK_SIZE, or the started block size when that is smaller
    max_num_seqs: int
    max_num_batched_tokens: int

    @classmethod
    def of(cls, info: CoreInfo) -> RestartLimits:
        return cls(info.num_blocks * info.kv_bytes_per_block, info.num_blocks,
                   min(MIN_BLOCK_SIZE, info.block_size), info.max_num_seqs, info.max_num_batched_tokens)


def rebuilt(old: EngineCore, options: dict[str, Any], limits: dict[str, int] | None = None) -> EngineCore:
    """The core ``old`` becomes with ``options``; raises (KVScopeError, TypeError,
    ValueError) and leaves ``old`` serving when they are refused. ``limits``: the
    operator's, as ``RestartLimits`` fields (default: what ``old`` has)."""
    from engine.engine_core.startup import build_engine_core

    bounds = RestartLimits(**limits) if limits is not None else RestartLimits.of(old.info)
    cfg = dataclasses.replace(old.config, **options)
    loaded = old.loaded
    per_block = loaded.spec.kv_bytes_per_block(cfg.block_size, loaded.dtype)
    if cfg.num_kv_blocks is None:  # "the default" is what the operator's budget holds, never more
        cfg = dataclasses.replace(cfg, num_kv_blocks=min(bounds.num_blocks, bounds.pool_bytes // per_block))
    check_restart(cfg, bounds, per_block)
    # Reuse the loaded weights: only the pool and the scheduler change. The new
    # pool is allocated before the old one is dropped, so a bad config (one past the
    # model's positions too: build_engine_core's check) leaves the old core serving
    # (at the price of both pools for a moment).
    return build_engine_core(cfg, loaded=loaded)


def check_restart(cfg: EngineConfig, limits: RestartLimits, per_block: int) -> None:
    """Refuse restarts a client should not be able to ask for: a pool bigger than the
    operator's, in bytes or in blocks (block_size 1 made 2M blocks and blocked the engine
    for 19 s) and a scheduler wider than the operator's."""
    if cfg.block_size < limits.min_block_size:
        raise ConfigError(f"block_size {cfg.block_size} is below this server's minimum of "
                          f"{limits.min_block_size}")
    if cfg.num_kv_blocks > limits.num_blocks or cfg.num_kv_blocks * per_block > limits.pool_bytes:
        raise ConfigError(f"{cfg.num_kv_blocks} blocks of {cfg.block_size} tokens need "
                          f"{cfg.num_kv_blocks * per_block} bytes; this server allows at most "
                          f"{limits.pool_bytes} bytes and {limits.num_blocks} blocks "
                          f"({min(limits.num_blocks, limits.pool_bytes // per_block)} blocks of "
                          f"{cfg.block_size} tokens)")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        value, most = getattr(cfg, name), getattr(limits, name)
        if value is not None and value > most:
            raise ConfigError(f"{name} {value} is above this server's {most}")

"""kvscope's events → vLLM's KV cache events, the way vLLM's block pool emits them.

- ``block_cached`` → ``BlockStored``. A run of consecutive ``block_cached`` events
  of one chain (each one's parent is the previous one's hash: the blocks one
  request's allocation filled) becomes one ``BlockStored``, as vLLM's
  ``cache_full_blocks`` emits one per call; its ``parent_block_hash`` is the hash of
  the block before the run (None for a chain's first block).
- ``block_evicted`` of a cached block (reused from the free queue, or forgotten
  after a failed forward) → ``BlockRemoved`` with that one hash, as vLLM's
  ``_maybe_evict_cached_block`` emits one per block.
- ``prefix_cache_reset`` → ``AllBlocksCleared``, and no ``BlockRemoved`` for the
  hashes the reset dropped (vLLM's ``reset_prefix_cache`` emits only that).

Nothing else is emitted: hits, frees and ref counts are not part of vLLM's stream.

Fields, as a vLLM 0.32 pod fills them for a one-group full-attention model (read off
a real ``vllm serve``'s bytes, tests/vllm/test_kv_events.py): ``medium`` ``"GPU"``
(vLLM's name for the engine's own KV pool, on a CPU build too), ``group_idx`` 0,
``kv_cache_spec_kind`` ``"full_attention"`` and ``extra_keys`` one null per block on
``BlockStored``; ``medium`` and ``group_idx`` on ``BlockRemoved``; ``lora_id`` and
``lora_name`` null (kvscope has no LoRA).

Which evictions belong to a reset: with ``block_evicted.reason`` ("reuse" | "reset"
| "rollback") the event says so. Without it (older recordings), a reset logs its
evictions back to back right before ``prefix_cache_reset``, while a reuse eviction
is always followed by the block's ``block_allocated`` or ``cow_copy``; so the
reason-less evictions immediately before a reset are the reset's.

Hashes: kvscope's block hash is a sha256 hex digest; vLLM sends
``int.from_bytes(digest, "big") & (2**64 - 1)``, the digest's low 64 bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.events.schema.types import BlockCached, BlockEvicted, Event, PrefixCacheReset
from engine.kv_events.types import (
    MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent,
)

_KV_TYPES = (BlockCached, BlockEvicted, PrefixCacheReset)
GROUP_IDX = 0  # kvscope's pool is one KV cache group
SPEC_KIND = "full_attention"  # vLLM's KVCacheSpecKind of every layer kvscope runs


def vllm_block_hash(hex_digest: str) -> int:
    """The uint64 vLLM would send for this digest (its ``maybe_convert_block_hash``)."""
    return int(hex_digest[-16:], 16)  # last 8 bytes of a big-endian integer = its low 64 bits


def is_reset_only(events: Sequence[Event]) -> bool:
    """True for the events of a prefix-cache reset alone (its evictions and the reset)."""
    return (any(isinstance(e, PrefixCacheReset) for e in events)
            and all(isinstance(e, (PrefixCacheReset, BlockEvicted)) for e in events))


def has_kv_events(events: Iterable[Event]) -> bool:
    """True when ``events`` map to at least one vLLM KV cache event."""
    return any(isinstance(e, _KV_TYPES) for e in events)


class _Run:
    """A BlockStored being built: consecutive blocks of one chain."""

    __slots__ = ("hashes", "parent", "tokens", "block_size", "last_hex")

    def __init__(self, e: BlockCached) -> None:
        self.hashes = [vllm_block_hash(e.hash)]
        self.parent = None if e.parent_hash is None else vllm_block_hash(e.parent_hash)
        self.tokens = list(e.token_ids)
        self.block_size = len(e.token_ids)  # a cached block is full
        self.last_hex = e.hash

    def extends(self, e: BlockCached) -> bool:
        return e.parent_hash == self.last_hex and len(e.token_ids) == self.block_size

    def add(self, e: BlockCached) -> None:
        self.hashes.append(vllm_block_hash(e.hash))
        self.tokens.extend(e.token_ids)
        self.last_hex = e.hash

    def event(self, medium: str | None) -> BlockStored:
        return BlockStored(tuple(self.hashes), self.parent, tuple(self.tokens), self.block_size,
                           None, medium, None, (None,) * len(self.hashes), GROUP_IDX, SPEC_KIND)


def to_kv_events(events: Iterable[Event], medium: str | None = MEDIUM_GPU) -> list[KVCacheEvent]:
    """vLLM's KV cache events for one step's kvscope events, in order."""
    out: list[KVCacheEvent | _Run] = []
    run: _Run | None = None  # the BlockStored the next block_cached may extend
    reasonless: list[int] = []  # indexes in out of the BlockRemoved run right before now
    for e in events:
        if isinstance(e, BlockCached):
            if run is not None and run.extends(e):
                run.add(e)
            else:
                run = _Run(e)
                out.append(run)
            reasonless.clear()
            continue
        run = None  # any other event ends the allocation that cached the run
        if isinstance(e, BlockEvicted):
            reason = getattr(e, "reason", None)
            if reason == "reset":
                continue
            out.append(BlockRemoved((vllm_block_hash(e.hash),), medium, GROUP_IDX))
            if reason is None:
                reasonless.append(len(out) - 1)
            else:
                reasonless.clear()
        elif isinstance(e, PrefixCacheReset):
            for i in reversed(reasonless):  # the reset's own evictions: AllBlocksCleared covers them
                del out[i]
            reasonless.clear()
            out.append(AllBlocksCleared())
        else:
            reasonless.clear()
    return [x.event(medium) if isinstance(x, _Run) else x for x in out]

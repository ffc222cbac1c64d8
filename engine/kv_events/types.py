"""vLLM's KV cache events as plain values: what kvscope publishes and what a decoder reads.

The names and field order are vLLM's (``vllm/distributed/kv_events.py``). Only the
fields kvscope can fill honestly are here; vLLM's defaulted extras (``extra_keys``,
``group_idx``, ``kv_cache_spec_kind``, ...) are left out, which current vLLM's map
encoding does for defaults too. A decoder ignores them when a foreign engine sends them.

Hashes are ``int`` (vLLM's default, the digest's low 64 bits) or ``bytes`` (vLLM with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); kvscope publishes ints.
"""

from __future__ import annotations

from dataclasses import dataclass

BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks became cached: one chain, ``parent_block_hash`` is the block before the first."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]  # len(block_hashes) * block_size tokens, block after block
    block_size: int
    lora_id: int | None = None
    medium: str | None = None  # "GPU" | "CPU" | "STORAGE" in vLLM
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the cache (evicted to be reused, or forgotten)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block is gone (a prefix-cache reset)."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """A decoded event of a type this decoder does not know (a newer engine); kept, not dropped."""

    type: str


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
DecodedEvent = KVCacheEvent | UnknownEvent


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One engine step's events. ``data_parallel_rank`` is None when the sender omits it
    (SGLang before it added ``attn_dp_rank``)."""

    ts: float
    events: tuple[DecodedEvent, ...]
    data_parallel_rank: int | None = None

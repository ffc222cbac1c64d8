"""vLLM's KV cache events as plain values: what kvscope publishes and what a decoder reads.

The names and field order are vLLM's (``vllm/distributed/kv_events.py``, 0.32): every
field vLLM 0.32 defines, the defaulted ones (``extra_keys``, ``group_idx``,
``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``, ``locality``, ``ownership``,
``session_id``) after the required ones, as on vLLM's structs. A defaulted field left
None is not sent (vLLM's ``omit_defaults``).

``medium`` is one of ``MEDIUMS``: vLLM's ``GPU`` (the engine's own KV pool, whatever
the device: vLLM 0.32 on CPU sends ``"GPU"``), ``CPU`` and ``STORAGE`` (offload tiers),
and SGLang's ``CPU_PINNED``, ``DISK`` and ``EXTERNAL``; a decoder keeps any string.

A placeholder ``BlockStored`` (vLLM's offloading connector: a hash known to be held on
a tier whose tokens it does not have) has no ``token_ids`` and ``block_size`` 0
(``BlockStored.is_placeholder``).

Hashes are ``int`` (vLLM's default, the digest's low 64 bits) or ``bytes`` (vLLM with
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); kvscope publishes ints.
"""

from __future__ import annotations

from dataclasses import dataclass

BlockHash = int | bytes

MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE = "GPU", "CPU", "STORAGE"  # vLLM's
MEDIUMS = (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE, "CPU_PINNED", "DISK", "EXTERNAL")  # + SGLang's


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks became cached: one chain, ``parent_block_hash`` is the block before the first."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]  # len(block_hashes) * block_size tokens, block after block
    block_size: int
    lora_id: int | None = None
    medium: str | None = None  # one of MEDIUMS
    lora_name: str | None = None
    extra_keys: tuple[tuple | None, ...] | None = None  # one entry per block (LoRA, mm, salt)
    group_idx: int | None = None  # the KV cache group (vLLM 0.32 sends 0 for a one-group model)
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None  # "LOCAL" | "REMOTE" relative to the publisher
    ownership: str | None = None  # the secondary offloading tier that generated it
    session_id: str | None = None

    @property
    def is_placeholder(self) -> bool:
        """A hash-only store (no tokens, block_size 0): held on its tier, contents unknown."""
        return self.block_size == 0 and not self.token_ids


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the cache (evicted to be reused, or forgotten)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


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

"""A decoded KV event batch → kvscope's hash-only events (``engine.events.schema.types``).

``BlockStored`` → ``kv_block_stored``, ``BlockRemoved`` → ``kv_block_removed``,
``AllBlocksCleared`` → ``kv_all_cleared``, each tagged with the pod, the step and
the batch's ``ts``; hashes become strings (``engine.events.schema.hash_key``); every
other field the source sent (vLLM 0.32's ``group_idx``, ``kv_cache_spec_kind``,
``extra_keys``, ``locality``, ``ownership``, ...) is kept (``extra_keys`` as arrays,
as JSON gives them back). ``session_id`` is not: a request's id in another engine says
nothing about its cache. Event types
this decoder does not know (a newer engine's) are counted, not recorded: they say
nothing kvscope can fold.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events.schema.hash_key import hash_key
from engine.events.schema.types import Event, KVAllCleared, KVBlockRemoved, KVBlockStored
from engine.kv_events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@dataclass(frozen=True, slots=True)
class Translated:
    events: list[Event]
    unknown: tuple[str, ...]  # type tags of events skipped


def translate(batch: KVEventBatch, pod: str, step: int) -> Translated:
    """kvscope's events for one batch; ValueError for an event that contradicts itself
    (e.g. ``token_ids`` not ``block_size`` per hash)."""
    out: list[Event] = []
    unknown: list[str] = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            parent = None if e.parent_block_hash is None else hash_key(e.parent_block_hash)
            extra = None if e.extra_keys is None else tuple(_arrays(k) for k in e.extra_keys)
            out.append(KVBlockStored(step, pod, tuple(hash_key(h) for h in e.block_hashes), parent,
                                     tuple(e.token_ids), e.block_size, batch.ts, e.medium,
                                     e.lora_name, e.group_idx, e.kv_cache_spec_kind,
                                     e.kv_cache_spec_sliding_window, extra, e.locality, e.ownership))
        elif isinstance(e, BlockRemoved):
            out.append(KVBlockRemoved(step, pod, tuple(hash_key(h) for h in e.block_hashes),
                                      batch.ts, e.medium, e.group_idx, e.locality, e.ownership))
        elif isinstance(e, AllBlocksCleared):
            out.append(KVAllCleared(step, pod, batch.ts))
        else:
            unknown.append(getattr(e, "type", type(e).__name__))
    return Translated(out, tuple(unknown))


def _arrays(v):
    """Tuples as lists, all the way down: what a recorded event reads back as."""
    return [_arrays(x) for x in v] if isinstance(v, (tuple, list)) else v

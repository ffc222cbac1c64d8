"""The wire encoding: msgpack via msgspec structs, exactly as vLLM's publisher writes it.

- The batch is always an array: ``[ts (float64), events, data_parallel_rank]``
  (vLLM's ``EventBatch`` is ``array_like``).
- ``"map"``: each event is a map with the tag first, ``{"type": "BlockStored",
  "block_hashes": ..., ...}``, fields in vLLM's order (current vLLM, since its PR #42892).
- ``"array"``: each event is a tagged array, ``["BlockStored", block_hashes, ...]``
  (vLLM <= 0.23 and SGLang), up to its last field that is set: the defaulted fields
  vLLM added later go only as far as needed (msgspec's ``array_like`` would send them
  all). Positional decoders of older versions ignore the trailing fields they do not
  know, and newer ones read missing trailing fields as unset.

Both encodings are built from one field list per event, so they cannot drift.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engine.kv_events.config import ENCODINGS
from engine.kv_events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

# vLLM 0.32's fields, in its order: the required ones, then the defaulted ones (None: omitted).
_STORED_FIELDS = [
    ("block_hashes", list[int | bytes]),
    ("parent_block_hash", int | bytes | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
    ("extra_keys", list[Any] | None, None),
    ("group_idx", int | None, None),
    ("kv_cache_spec_kind", str | None, None),
    ("kv_cache_spec_sliding_window", int | None, None),
    ("locality", str | None, None),
    ("ownership", str | None, None),
    ("session_id", str | None, None),
]
_REMOVED_FIELDS = [("block_hashes", list[int | bytes]), ("medium", str | None),
                   ("group_idx", int | None, None), ("locality", str | None, None),
                   ("ownership", str | None, None)]
STORED_KEYS = tuple(f[0] for f in _STORED_FIELDS)  # the decoder reads a tagged array by these
REMOVED_KEYS = tuple(f[0] for f in _REMOVED_FIELDS)


# tag=True: the tag is the class name, under "type" first in the map; omit_defaults: a
# defaulted field left None is not sent (vLLM's KVCacheEvent options).
_KW: dict[str, Any] = dict(omit_defaults=True, gc=False, tag=True)
_MAP_STRUCTS = {BlockStored: msgspec.defstruct("BlockStored", _STORED_FIELDS, **_KW),
                BlockRemoved: msgspec.defstruct("BlockRemoved", _REMOVED_FIELDS, **_KW),
                AllBlocksCleared: msgspec.defstruct("AllBlocksCleared", [], **_KW)}
_KEYS = {BlockStored: STORED_KEYS, BlockRemoved: REMOVED_KEYS, AllBlocksCleared: ()}
_REQUIRED = {cls: sum(len(f) == 2 for f in fields) for cls, fields in
             ((BlockStored, _STORED_FIELDS), (BlockRemoved, _REMOVED_FIELDS), (AllBlocksCleared, []))}


class _WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class BatchEncoder:
    """Encodes KVEventBatch values to payload bytes in one encoding ("map" or "array")."""

    def __init__(self, encoding: str = "map") -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {encoding!r}")
        self.encoding = encoding
        self._msgpack = msgspec.msgpack.Encoder()

    def _wire(self, e: Any) -> Any:
        cls = type(e)
        if cls not in _KEYS:
            raise TypeError(f"cannot encode {e!r} as a vLLM KV cache event")
        values = [getattr(e, k) for k in _KEYS[cls]]
        if self.encoding == "map":
            return _MAP_STRUCTS[cls](*values)
        while len(values) > _REQUIRED[cls] and values[-1] is None:
            values.pop()
        return [cls.__name__, *values]

    def encode(self, batch: KVEventBatch) -> bytes:
        wire = _WireBatch(batch.ts, [self._wire(e) for e in batch.events], batch.data_parallel_rank)
        return self._msgpack.encode(wire)


def seq_bytes(seq: int) -> bytes:
    """The sequence frame: 8 bytes, big-endian, unsigned."""
    return seq.to_bytes(8, "big")


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # b"\xff" * 8: the replay's end marker

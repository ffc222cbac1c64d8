"""The wire encoding: msgpack via msgspec structs, exactly as vLLM's publisher writes it.

- The batch is always an array: ``[ts (float64), events, data_parallel_rank]``
  (vLLM's ``EventBatch`` is ``array_like``).
- ``"map"``: each event is a map with the tag first, ``{"type": "BlockStored",
  "block_hashes": ..., ...}``, fields in vLLM's order (current vLLM, since its PR #42892).
- ``"array"``: each event is a tagged array, ``["BlockStored", block_hashes, ...]``
  (vLLM <= 0.23 and SGLang). Positional decoders of older versions ignore the trailing
  fields they do not know, and newer ones read missing trailing fields as unset.

The structs are built from one field list per event, so both encodings cannot drift.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engine.kv_events.types import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

_STORED_FIELDS = [
    ("block_hashes", list[int | bytes]),
    ("parent_block_hash", int | bytes | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
]
_REMOVED_FIELDS = [("block_hashes", list[int | bytes]), ("medium", str | None)]


def _structs(array_like: bool) -> tuple[type, type, type]:
    # tag=True: the tag is the class name, under "type" in a map, first in an array.
    kw: dict[str, Any] = dict(array_like=array_like, omit_defaults=True, gc=False, tag=True)
    return (msgspec.defstruct("BlockStored", _STORED_FIELDS, **kw),
            msgspec.defstruct("BlockRemoved", _REMOVED_FIELDS, **kw),
            msgspec.defstruct("AllBlocksCleared", [], **kw))


_FAMILIES = {"map": _structs(array_like=False), "array": _structs(array_like=True)}


class _WireBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class BatchEncoder:
    """Encodes KVEventBatch values to payload bytes in one encoding ("map" or "array")."""

    def __init__(self, encoding: str = "map") -> None:
        if encoding not in _FAMILIES:
            raise ValueError(f"encoding must be one of {sorted(_FAMILIES)}, got {encoding!r}")
        self.encoding = encoding
        self._stored, self._removed, self._cleared = _FAMILIES[encoding]
        self._msgpack = msgspec.msgpack.Encoder()

    def _wire(self, e: Any) -> Any:
        if isinstance(e, BlockStored):
            return self._stored(list(e.block_hashes), e.parent_block_hash, list(e.token_ids),
                                e.block_size, e.lora_id, e.medium, e.lora_name)
        if isinstance(e, BlockRemoved):
            return self._removed(list(e.block_hashes), e.medium)
        if isinstance(e, AllBlocksCleared):
            return self._cleared()
        raise TypeError(f"cannot encode {e!r} as a vLLM KV cache event")

    def encode(self, batch: KVEventBatch) -> bytes:
        wire = _WireBatch(batch.ts, [self._wire(e) for e in batch.events], batch.data_parallel_rank)
        return self._msgpack.encode(wire)


def seq_bytes(seq: int) -> bytes:
    """The sequence frame: 8 bytes, big-endian, unsigned."""
    return seq.to_bytes(8, "big")


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # b"\xff" * 8: the replay's end marker

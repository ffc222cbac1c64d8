"""Reading a vLLM-format KV event stream: frames, batches, both event encodings.

For kvscope's tests and for attach mode, which subscribes to vLLM, SGLang or
kvscope. Decoding is untyped, then branches per event: a map is read by key
(current vLLM and SGLang), a tagged array by position (vLLM <= 0.23, older
SGLang), both with every field vLLM 0.32 defines (``engine.kv_events.encoding``'s
field lists). Unknown fields are ignored, missing optional ones read as None, hashes
may be ints or bytes, an unknown event type becomes ``UnknownEvent``. A batch is an
array ``[ts, events, rank]`` or (tolerated) a map with those keys.

Frames:
- live (PUB): ``[topic, seq, payload]``;
- replay replies, after the DEALER's empty delimiter: ``[topic, seq, payload]``
  (current vLLM, since its PR #45177) or ``[seq, payload]`` (older vLLM, SGLang);
  the end marker has seq -1 (``0xFF`` x 8) and an empty payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from engine.kv_events.encoding import END_SEQ, REMOVED_KEYS, STORED_KEYS
from engine.kv_events.types import (
    AllBlocksCleared, BlockRemoved, BlockStored, DecodedEvent, KVEventBatch, UnknownEvent,
)


class KVEventsDecodeError(ValueError):
    """A frame or payload that is not a vLLM-format KV event batch."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One received message. ``topic`` is None in the two-frame replay layout."""

    topic: bytes | None
    seq: int  # -1: the replay's end marker
    payload: bytes

    @property
    def is_end(self) -> bool:
        return self.seq == -1


def decode_seq(raw: bytes) -> int:
    if len(raw) != 8:
        raise KVEventsDecodeError(f"a sequence frame has 8 bytes, got {len(raw)}: {raw[:16]!r}")
    return -1 if raw == END_SEQ else int.from_bytes(raw, "big")


def parse_live(frames: list[bytes]) -> Frame:
    """A PUB message: ``[topic, seq, payload]``."""
    if len(frames) != 3:
        raise KVEventsDecodeError(f"a KV event message has 3 frames (topic, seq, payload), got {len(frames)}")
    return Frame(frames[0], decode_seq(frames[1]), frames[2])


def parse_replay(frames: list[bytes]) -> Frame:
    """A replay reply without the DEALER's delimiter: 3 frames (topic first) or 2."""
    if len(frames) == 3:
        return Frame(frames[0], decode_seq(frames[1]), frames[2])
    if len(frames) == 2:
        return Frame(None, decode_seq(frames[0]), frames[1])
    raise KVEventsDecodeError(f"a replay reply has 2 or 3 frames after the delimiter, got {len(frames)}")


_raw = msgspec.msgpack.Decoder()


def decode_batch(payload: bytes) -> KVEventBatch:
    """``[ts, events, data_parallel_rank?]`` → KVEventBatch; raises KVEventsDecodeError."""
    try:
        obj = _raw.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventsDecodeError(f"payload is not msgpack: {exc}") from None
    if isinstance(obj, dict):  # tolerated: a batch encoded as a map
        obj = [obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")]
    if not isinstance(obj, list) or len(obj) < 2:
        raise KVEventsDecodeError(f"a batch is an array [ts, events, data_parallel_rank], got {_brief(obj)}")
    ts, events = obj[0], obj[1]
    rank = obj[2] if len(obj) > 2 else None
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise KVEventsDecodeError(f"batch ts must be a number, got {_brief(ts)}")
    if not isinstance(events, list):
        raise KVEventsDecodeError(f"batch events must be an array, got {_brief(events)}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise KVEventsDecodeError(f"data_parallel_rank must be an integer, got {_brief(rank)}")
    return KVEventBatch(float(ts), tuple(decode_event(e) for e in events), rank)


def decode_event(obj: Any) -> DecodedEvent:
    """One event, a tagged map or a tagged array."""
    if isinstance(obj, dict):
        tag = obj.get("type")
        get = obj.get
    elif isinstance(obj, list) and obj:
        tag = obj[0]
        keys = {"BlockStored": STORED_KEYS, "BlockRemoved": REMOVED_KEYS}.get(tag, ())
        values = dict(zip(keys, obj[1:]))  # extra trailing fields: ignored
        get = values.get
    else:
        raise KVEventsDecodeError(f"an event is a tagged map or a tagged array, got {_brief(obj)}")
    if not isinstance(tag, str):
        raise KVEventsDecodeError(f"an event's tag must be a string, got {_brief(tag)}")
    if tag == "BlockStored":
        hashes = _hashes(get("block_hashes"), tag)
        parent = get("parent_block_hash")
        if parent is not None:
            _check_hash(parent, "parent_block_hash")
        tokens = get("token_ids")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise KVEventsDecodeError(f"BlockStored.token_ids must be an array of ints, got {_brief(tokens)}")
        size = get("block_size")
        if not isinstance(size, int) or isinstance(size, bool):
            raise KVEventsDecodeError(f"BlockStored.block_size must be an integer, got {_brief(size)}")
        extra = get("extra_keys")
        if extra is not None:
            if not isinstance(extra, list) or not all(k is None or isinstance(k, list) for k in extra):
                raise KVEventsDecodeError(f"BlockStored.extra_keys must be an array of arrays or nulls, "
                                          f"got {_brief(extra)}")
            extra = tuple(None if k is None else _frozen(k) for k in extra)
        return BlockStored(hashes, parent, tuple(tokens), size, _opt(get, tag, "lora_id", int),
                           _opt(get, tag, "medium", str), _opt(get, tag, "lora_name", str), extra,
                           _opt(get, tag, "group_idx", int), _opt(get, tag, "kv_cache_spec_kind", str),
                           _opt(get, tag, "kv_cache_spec_sliding_window", int),
                           _opt(get, tag, "locality", str), _opt(get, tag, "ownership", str),
                           _opt(get, tag, "session_id", str))
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(get("block_hashes"), tag), _opt(get, tag, "medium", str),
                            _opt(get, tag, "group_idx", int), _opt(get, tag, "locality", str),
                            _opt(get, tag, "ownership", str))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return UnknownEvent(tag)


def _opt(get: Any, tag: str, key: str, kind: type) -> Any:
    """An optional field: None or a value of ``kind`` (never a bool for an int)."""
    v = get(key)
    if v is None or (isinstance(v, kind) and not isinstance(v, bool)):
        return v
    raise KVEventsDecodeError(f"{tag}.{key} must be {'an integer' if kind is int else 'a string'} "
                              f"or null, got {_brief(v)}")


def _frozen(v: Any) -> Any:
    """Arrays as tuples, all the way down (extra keys such as ``[mm_hash, offset]``)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, list) else v


def _hashes(v: Any, tag: str) -> tuple[int | bytes, ...]:
    if not isinstance(v, list):
        raise KVEventsDecodeError(f"{tag}.block_hashes must be an array, got {_brief(v)}")
    for h in v:
        _check_hash(h, f"{tag}.block_hashes")
    return tuple(v)


def _check_hash(h: Any, where: str) -> None:
    if not isinstance(h, (int, bytes)) or isinstance(h, bool):
        raise KVEventsDecodeError(f"{where}: a block hash is an int or bytes, got {_brief(h)}")


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."

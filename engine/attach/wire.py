"""What a pod's KV event batches look like on the wire: its dialect, and the wire doctor's rows.

Consumers broke when vLLM moved from tagged arrays to tagged maps (kthena #1535, llm-d-kv-cache
#661), so the fidelity monitor says which dialect each pod speaks (``dialect``), read from the
raw msgpack, untyped, as it arrived:

- ``events``: ``map`` (current vLLM, SGLang), ``array`` (vLLM <= 0.23, older SGLang), ``mixed``,
  or ``none`` (a batch without events);
- ``hashes``: ``int`` (vLLM's default uint64), ``bytes`` (the 32-byte digest), ``mixed``, ``none``;
- ``frames``: 3 (live, and vLLM's replay since #45177) or 2 (older vLLM's and SGLang's replay);
- ``fields``: ``vllm-0.3x`` (a field only vLLM >= 0.3x sends: ``extra_keys``, ``group_idx``,
  ``kv_cache_spec_kind``, ``locality``, ``ownership``, ``lookahead_token_ids``, or an array
  event longer than 7 fields), ``sglang`` (``cache_salt``, or an SGLang-only medium), or
  ``common`` (what both send);
- ``batch``: ``array`` (everyone) or ``map`` (tolerated).

``explain`` is the wire doctor: one batch, field by field (path, msgpack type, value), with
array events' fields named by vLLM's order and the ones past it marked unknown.

Pure: bytes in, plain values out.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engine.kv_events.encoding import REMOVED_KEYS, STORED_KEYS

VLLM_ONLY = frozenset({"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
                       "locality", "ownership", "lookahead_token_ids", "session_id"})
SGLANG_ONLY = frozenset({"cache_salt"})
SGLANG_MEDIA = frozenset({"CPU_PINNED", "DISK", "EXTERNAL"})
COMMON_ARRAY_FIELDS = 7  # BlockStored's fields up to lora_name: what vLLM <= 0.23 and SGLang send
MAX_ROWS = 400  # the wire doctor shows at most this many fields of one batch
MAX_VALUE_CHARS = 120

_raw = msgspec.msgpack.Decoder()


def _kind(values: set[str]) -> str:
    return "none" if not values else next(iter(values)) if len(values) == 1 else "mixed"


def dialect(payload: bytes, frames: int) -> dict[str, Any]:
    """The dialect of one batch (see the module doc); ``{"error": ...}`` when not msgpack."""
    try:
        obj = _raw.decode(payload)
    except msgspec.DecodeError as exc:
        return {"frames": frames, "error": f"not msgpack: {exc}"}
    batch = "map" if isinstance(obj, dict) else "array"
    events = obj.get("events") if isinstance(obj, dict) else (obj[1] if isinstance(obj, list) and len(obj) > 1 else None)
    enc: set[str] = set()
    hashes: set[str] = set()
    fields = "common"
    for e in events if isinstance(events, list) else ():
        if isinstance(e, dict):
            enc.add("map")
            keys = set(e)
            hs = e.get("block_hashes")
            medium = e.get("medium")
        elif isinstance(e, list) and e:
            enc.add("array")
            keys = set()
            hs = e[1] if len(e) > 1 else None
            medium = e[6] if e[0] == "BlockStored" and len(e) > 6 else None
            if e[0] == "BlockStored" and len(e) - 1 > COMMON_ARRAY_FIELDS:
                keys = {"extra_keys"}
        else:
            continue
        for h in hs if isinstance(hs, list) else ():
            hashes.add("bytes" if isinstance(h, bytes) else "int")
        if keys & SGLANG_ONLY or medium in SGLANG_MEDIA:
            fields = "sglang"
        elif keys & VLLM_ONLY and fields != "sglang":
            fields = "vllm-0.3x"
    return {"frames": frames, "batch": batch, "events": _kind(enc), "hashes": _kind(hashes), "fields": fields}


def dialect_key(d: dict[str, Any]) -> str:
    """One line for a dialect: ``events map · hashes int · 3 frames · fields vllm-0.3x``."""
    if "error" in d:
        return f"undecodable · {d['frames']} frames"
    return f"events {d['events']} · hashes {d['hashes']} · {d['frames']} frames · fields {d['fields']}"


def _value(v: Any) -> tuple[str, str]:
    if isinstance(v, bytes):
        return "bin", v.hex() if len(v) <= 48 else v[:48].hex() + f"… ({len(v)} bytes)"
    if isinstance(v, bool) or v is None:
        return ("bool" if isinstance(v, bool) else "nil"), repr(v)
    if isinstance(v, int):
        return "int", str(v)
    if isinstance(v, float):
        return "float", repr(v)
    if isinstance(v, str):
        return "str", v if len(v) <= MAX_VALUE_CHARS else v[:MAX_VALUE_CHARS] + "…"
    text = repr(v)
    return type(v).__name__, text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def explain(payload: bytes) -> list[dict[str, str]]:
    """The wire doctor: one batch field by field, ``[{"path", "type", "value"}]``."""
    try:
        obj = _raw.decode(payload)
    except msgspec.DecodeError as exc:
        return [{"path": "(payload)", "type": "error", "value": f"not msgpack: {exc}"}]
    rows: list[dict[str, str]] = []

    def add(path: str, v: Any, note: str = "") -> None:
        if len(rows) < MAX_ROWS:
            t, text = _value(v)
            rows.append({"path": path, "type": t + note, "value": text})

    if isinstance(obj, dict):
        items = list(obj.items())
        add("(batch)", f"map of {len(obj)} keys")
    elif isinstance(obj, list):
        items = list(zip(("ts", "events", "data_parallel_rank"), obj))
        items += [(f"#{i} (unknown)", v) for i, v in enumerate(obj[3:], 3)]
        add("(batch)", f"array of {len(obj)}")
    else:
        return [{"path": "(batch)", "type": type(obj).__name__, "value": "not a batch: " + _value(obj)[1]}]
    for name, v in items:
        if name != "events" or not isinstance(v, list):
            add(str(name), v)
            continue
        add("events", f"{len(v)} event(s)")
        for i, e in enumerate(v):
            base = f"events[{i}]"
            if isinstance(e, dict):
                add(f"{base}", "tagged map")
                pairs = list(e.items())
            elif isinstance(e, list) and e:
                add(f"{base}", f"tagged array of {len(e)}")
                keys = {"BlockStored": STORED_KEYS, "BlockRemoved": REMOVED_KEYS}.get(e[0], ())
                pairs = [("type", e[0])] + [(keys[j] if j < len(keys) else f"#{j + 1} (unknown)", x)
                                            for j, x in enumerate(e[1:])]
            else:
                add(base, e, " (not an event)")
                continue
            for k, x in pairs:
                if isinstance(x, list) and k in ("block_hashes", "token_ids") and x:
                    add(f"{base}.{k}", f"{len(x)} × {_value(x[0])[0]}: " + ", ".join(_value(y)[1][:18] for y in x[:8])
                        + (" …" if len(x) > 8 else ""))
                else:
                    add(f"{base}.{k}", x)
    return rows

"""hash_key: one string form for a foreign engine's block hash, int or bytes.

vLLM sends a block hash as a uint64 (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, its
default: the digest's low 64 bits) or as the raw digest bytes (``=0``); other
publishers may send signed 64-bit ints. kvscope's hash-only events hold strings so
that both kinds fit JSON, SQLite and dict keys alike:

- an int becomes 16 lowercase hex digits of its 64-bit two's-complement value
  (``255`` → ``"00000000000000ff"``, ``-1`` → ``"ffffffffffffffff"``);
- bytes become their lowercase hex (a 32-byte sha256 digest → 64 digits).

A stream uses one kind throughout, so the two forms never need to meet.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def hash_key(h: int | bytes) -> str:
    """The string kvscope stores for block hash ``h``; ValueError for anything else."""
    if isinstance(h, bool):
        raise ValueError(f"a block hash is an int or bytes, got {h!r}")
    if isinstance(h, int):
        if not -(1 << 63) <= h <= _MASK64:
            raise ValueError(f"an int block hash fits 64 bits, got {h}")
        return f"{h & _MASK64:016x}"
    if isinstance(h, (bytes, bytearray, memoryview)):
        if not len(h):
            raise ValueError("a bytes block hash is not empty")
        return bytes(h).hex()
    raise ValueError(f"a block hash is an int or bytes, got {type(h).__name__}")

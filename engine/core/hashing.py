"""Chained block hashes: H(parent hash, block token ids, extra keys).

Every algorithm here is stable across processes and runs (a stored run replays with the
same hashes), and only full blocks are hashed. Hashes travel as hex digests. Three
algorithms (``CacheConfig.prefix_caching_hash_algo``):

- ``"kvscope"``, kvscope's own before it took vLLM's: sha256 over the text
  ``parent|t0,t1,...|extra``, the root block's parent spelled ``root``.
- ``"sha256"``, vLLM's default and kvscope's (vllm/v1/core/kv_cache_utils.py ``hash_block_tokens``,
  vllm/utils/hashing.py ``sha256``): sha256 of
  ``pickle.dumps((parent_digest, tuple(token_ids), extra_keys), pickle.HIGHEST_PROTOCOL)``.
- ``"sha256_cbor"``, vLLM's language-neutral one: the same tuple as canonical CBOR
  (``cbor2.dumps(obj, canonical=True)``; the small encoder below, no cbor2 needed).

For vLLM's two the root block's parent is vLLM's ``NONE_HASH``: the algorithm applied to
the seed, which is ``$PYTHONHASHSEED`` when set and else the fixed ``"vllm-none-hash"``
(vLLM >= 0.3x; its non-cryptographic xxhash algorithms draw a random seed instead and are
not offered here). ``extra_keys`` is vLLM's tuple (LoRA, multimodal, cache-salt keys) or
None, which is what a kvscope request always has. So the same tokens give the same block
hash as a real vLLM started with the same algorithm and seed, and the same
``int.from_bytes(digest, "big") & (2**64 - 1)`` in the KV events (engine.kv_events.mapping).

Pure Python (hashlib and pickle), as everything in engine.core.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

from engine import envs

HASH_ALGOS = ("kvscope", "sha256", "sha256_cbor")
DEFAULT_HASH_ALGO = "sha256"  # vLLM's default: the same tokens give a real vLLM's hashes
VLLM_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's DEFAULT_NONE_HASH_SEED
_INT = frozenset((int,))  # token ids that pickle as themselves


def _int_tuple(token_ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(map(int, token_ids))


def check_hash_algo(algo) -> None:
    """Raise ValueError unless ``algo`` is one of ``HASH_ALGOS``."""
    if algo not in HASH_ALGOS:
        raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(map(repr, HASH_ALGOS))}, "
                         f"got {algo!r}")


# ---- vLLM's serialisations ------------------------------------------------------------

def vllm_sha256(obj: Any) -> bytes:
    """vllm.utils.hashing.sha256: sha256 of the object's pickle (highest protocol)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _cbor_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for info, fmt, limit in ((24, ">B", 1 << 8), (25, ">H", 1 << 16), (26, ">I", 1 << 32), (27, ">Q", 1 << 64)):
        if n < limit:
            return bytes([major << 5 | info]) + struct.pack(fmt, n)
    raise ValueError(f"integer too large for this CBOR encoder: {n}")


def cbor_canonical(obj: Any) -> bytes:
    """Canonical CBOR (RFC 8949 4.2.1: shortest heads) of None, bools, ints, bytes, str,
    tuples and lists, byte for byte what ``cbor2.dumps(obj, canonical=True)`` gives."""
    out = bytearray()

    def enc(o: Any) -> None:
        if o is None:
            out.append(0xF6)
        elif o is True or o is False:
            out.append(0xF5 if o else 0xF4)
        elif isinstance(o, int):
            out.extend(_cbor_head(0, o) if o >= 0 else _cbor_head(1, -1 - o))
        elif isinstance(o, (bytes, bytearray, memoryview)):
            b = bytes(o)
            out.extend(_cbor_head(2, len(b)) + b)
        elif isinstance(o, str):
            b = o.encode("utf-8")
            out.extend(_cbor_head(3, len(b)) + b)
        elif isinstance(o, (tuple, list)):
            out.extend(_cbor_head(4, len(o)))
            for item in o:
                enc(item)
        else:
            raise TypeError(f"cannot CBOR-encode {type(o).__name__} in a block hash")

    enc(obj)
    return bytes(out)


def vllm_sha256_cbor(obj: Any) -> bytes:
    """vllm.utils.hashing.sha256_cbor: sha256 of the object's canonical CBOR."""
    return hashlib.sha256(cbor_canonical(obj)).digest()


_VLLM_FNS: dict[str, Callable[[Any], bytes]] = {"sha256": vllm_sha256, "sha256_cbor": vllm_sha256_cbor}


def none_hash_seed() -> str:
    """vLLM's resolve_none_hash_seed for its cryptographic algorithms."""
    seed = envs.PYTHONHASHSEED.get()
    return seed if seed is not None else VLLM_NONE_HASH_SEED


def none_hash(algo: str, seed: str | None = None) -> bytes:
    """vLLM's NONE_HASH (the root block's parent) for ``algo``."""
    return _VLLM_FNS[algo](none_hash_seed() if seed is None else seed)


# ---- block hashes ---------------------------------------------------------------------

def _kvscope_hash(parent_hash: str | None, token_ids: Sequence[int], extra_keys: Any) -> str:
    h = hashlib.sha256()
    h.update((parent_hash or "root").encode())
    h.update(b"|")
    h.update(",".join(map(str, token_ids)).encode())
    h.update(b"|")
    h.update((extra_keys or "").encode())
    return h.hexdigest()


class BlockHasher:
    """``hasher(parent_hex | None, token_ids, extra_keys) -> hex digest`` for one algorithm;
    vLLM's root parent (``NONE_HASH``) is resolved once, when the hasher is made."""

    __slots__ = ("algo", "_fn", "_root")

    def __init__(self, algo: str = DEFAULT_HASH_ALGO, seed: str | None = None) -> None:
        check_hash_algo(algo)
        self.algo = algo
        self._fn = _VLLM_FNS.get(algo)
        self._root = none_hash(algo, seed) if self._fn else None

    def __call__(self, parent_hash: str | None, token_ids: Sequence[int], extra_keys: Any = None) -> str:
        if self._fn is None:
            return _kvscope_hash(parent_hash, token_ids, extra_keys)
        if extra_keys == "":  # kvscope's "no extra keys"
            extra_keys = None
        if extra_keys is not None and not isinstance(extra_keys, tuple):
            raise TypeError(f"vLLM's extra_keys are a tuple or None, got {extra_keys!r}")
        parent = bytes.fromhex(parent_hash) if parent_hash else self._root
        return self._fn((parent, tuple(map(int, token_ids)), extra_keys)).hex()

    def full_blocks(self, token_ids: Sequence[int], block_size: int, known: list[str],
                    extra_keys: Any = None, num_blocks: int | None = None,
                    all_int: bool = False) -> list[str]:
        """Extend ``known`` (hashes of the first blocks) to every full block of ``token_ids``
        (to the first ``num_blocks`` of them when given: no copy of a long list's head).
        ``all_int``: the caller knows every token is a Python int (not checked again).

        For vLLM's sha256 with no extra keys (every kvscope request) the chain runs on the
        digests: one ``fromhex`` for the known parent rather than one per block, and the
        same bytes hashed as ``__call__`` hashes (tests/core/test_vllm_hashing.py)."""
        start, end = len(known), len(token_ids) // block_size
        if num_blocks is not None:
            end = min(end, num_blocks)
        if start >= end:
            return known
        if self._fn is vllm_sha256 and (extra_keys is None or extra_keys == ""):
            parent = bytes.fromhex(known[-1]) if start else self._root
            dumps, sha, proto, append = pickle.dumps, hashlib.sha256, pickle.HIGHEST_PROTOCOL, known.append
            a, b = start * block_size, end * block_size
            # every token a Python int already (bools and numpy ints are not): tuple(slice)
            # pickles as tuple(map(int, slice)) does, at a fifth of the cost
            as_tuple = tuple if all_int or _INT.issuperset(map(type, token_ids[a:b])) else _int_tuple
            for i in range(a, b, block_size):
                parent = sha(dumps((parent, as_tuple(token_ids[i:i + block_size]), None), proto)).digest()
                append(parent.hex())
            return known
        for i in range(start, end):
            parent = known[i - 1] if i else None
            known.append(self(parent, token_ids[i * block_size:(i + 1) * block_size], extra_keys))
        return known


_HASHERS: dict[tuple[str, str | None], BlockHasher] = {}


def get_hasher(algo: str = DEFAULT_HASH_ALGO) -> BlockHasher:
    """The hasher of ``algo`` with the seed of this process's environment (cached per seed)."""
    key = (algo, None if algo == "kvscope" else none_hash_seed())
    hasher = _HASHERS.get(key)
    if hasher is None:
        hasher = _HASHERS[key] = BlockHasher(algo)
    return hasher


def hash_block(parent_hash: str | None, token_ids: Sequence[int], extra_keys: Any = "",
               algo: str = DEFAULT_HASH_ALGO) -> str:
    """Hex digest identifying a block by its whole prefix and its own tokens."""
    return get_hasher(algo)(parent_hash, token_ids, extra_keys)


def hash_full_blocks(token_ids: Sequence[int], block_size: int, known: list[str],
                     extra_keys: Any = "", algo: str = DEFAULT_HASH_ALGO) -> list[str]:
    """Extend ``known`` (hashes of the first blocks) to every full block of ``token_ids``."""
    return get_hasher(algo).full_blocks(token_ids, block_size, known, extra_keys)

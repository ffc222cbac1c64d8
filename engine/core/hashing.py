"""Chained block hashes: H(parent hash, block token ids, extra keys).

sha256 over a canonical byte string, so hashes are stable across processes and
runs (a stored run replays with the same hashes). Only full blocks are hashed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def hash_block(parent_hash: str | None, token_ids: Sequence[int], extra_keys: str = "") -> str:
    """Hex digest identifying a block by its whole prefix and its own tokens."""
    h = hashlib.sha256()
    h.update((parent_hash or "root").encode())
    h.update(b"|")
    h.update(",".join(map(str, token_ids)).encode())
    h.update(b"|")
    h.update(extra_keys.encode())
    return h.hexdigest()


def hash_full_blocks(token_ids: Sequence[int], block_size: int, known: list[str],
                     extra_keys: str = "") -> list[str]:
    """Extend ``known`` (hashes of the first blocks) to every full block of ``token_ids``."""
    for i in range(len(known), len(token_ids) // block_size):
        parent = known[i - 1] if i else None
        known.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra_keys))
    return known

"""Token ids → the strings (and bytes) that logprobs and echo show, off the engine thread.

The engine's tokenizer belongs to the engine thread; the API decodes with its own
Rust ``tokenizers.Tokenizer`` loaded from the file the engine names in its config
(``tokenizer_file``), as the dashboard does. A token's string is what decoding it
alone gives (a piece of a multi-byte character shows as U+FFFD, as in vLLM); its
``bytes`` are exact for byte-level BPE tokenizers (GPT-2 style, SmolLM2), so a client
can rebuild split characters, and the UTF-8 of that string otherwise.

Writer: none after construction (the id → string cache only grows, on the loop thread).
"""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte → printable-character map, inverted.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


class TokenStrings:
    """Decoding for one tokenizer file; ``None`` path: ids show as ``token_id:N``."""

    def __init__(self, path: str | None) -> None:
        self.tok = None
        if path and os.path.isfile(path):
            try:
                self.tok = _load(path)
            except Exception:  # a foreign or corrupt file: fall back to ids, never fail a request
                self.tok = None
        self.byte_level = self.tok is not None and type(self.tok.decoder).__name__ == "ByteLevel"
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def decode(self, ids: list[int]) -> str:
        if self.tok is None:
            return "".join(f"token_id:{t}" for t in ids)
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def token(self, token_id: int) -> tuple[str, list[int]]:
        """(string, bytes) of one token."""
        hit = self._cache.get(token_id)
        if hit is None:
            text = self.decode([token_id])
            hit = self._cache[token_id] = (text, self._bytes(token_id, text))
        return hit

    def _bytes(self, token_id: int, text: str) -> list[int]:
        if self.byte_level:
            piece = self.tok.id_to_token(token_id)
            table = _byte_decoder()
            if piece is not None and all(ch in table for ch in piece):
                return [table[ch] for ch in piece]
        return list(text.encode("utf-8"))

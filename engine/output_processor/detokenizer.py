"""Incremental detokenization: one sample's text, grown token by token in O(1) amortized.

Re-decoding a whole sequence per token costs O(n) per token. Instead, as vLLM's
incremental detokenizers do, only a short window is decoded:

- ``FastDetokenizer`` (every tokenizer with a Rust backend, i.e. every fast HF
  tokenizer) feeds ids to ``tokenizers.decoders.DecodeStream``, which keeps the last
  emitted token as a prefix and yields text once it forms complete UTF-8.
- ``SlowDetokenizer`` (anything else with ``decode``) keeps a prefix offset and a read
  offset into the ids: it decodes ``ids[prefix:]`` and ``ids[prefix:read]`` and emits
  their difference once it does not end in an incomplete character.

Both hold back the bytes of a character split across tokens (no U+FFFD in a delta
for valid text), and ``flush`` emits what is still held when generation ends, so the
concatenated pieces equal ``tokenizer.decode(all ids)``. The text is decoded from the
sample's own tokens (not primed with the prompt), as kvscope always has.
"""

from __future__ import annotations

import abc
from typing import Any

_REPLACEMENT = "\ufffd"
# A UTF-8 character spans at most 4 bytes, hence at most 4 byte tokens: a window still
# ending in U+FFFD after this many tokens holds invalid bytes that will never complete.
_MAX_PENDING = 8


class IncrementalDetokenizer(abc.ABC):
    """Text of one token stream; ``add`` returns the text that token made decodable."""

    @abc.abstractmethod
    def add(self, token_id: int) -> str:
        """Feed one id; the newly complete text ("" while a character is unfinished)."""

    @abc.abstractmethod
    def flush(self) -> str:
        """The text of ids still held back (a character that never completed)."""


class FastDetokenizer(IncrementalDetokenizer):
    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._skip = skip_special_tokens
        self._new_stream = lambda: DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stream = self._new_stream()
        self._pending: list[int] = []  # ids fed since the stream last emitted text

    def add(self, token_id: int) -> str:
        try:
            piece = self._stream.step(self._backend, token_id)
        except Exception:  # a state the stream cannot continue from: restart it here
            text = self._tokenizer.decode(self._pending + [token_id], skip_special_tokens=self._skip)
            self._stream, self._pending = self._new_stream(), []
            return text
        if piece is None:
            self._pending.append(token_id)
            return ""
        self._pending = []
        return piece

    def flush(self) -> str:
        text = self._tokenizer.decode(self._pending, skip_special_tokens=self._skip) if self._pending else ""
        self._pending = []
        return text


class SlowDetokenizer(IncrementalDetokenizer):
    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] decoded once already: context for the next piece
        self._read = 0  # ids before read are emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        stuck = len(self._ids) - self._read > _MAX_PENDING
        if len(new_text) > len(prefix_text) and (stuck or not new_text.endswith(_REPLACEMENT)):
            self._prefix, self._read = self._read, len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])[len(prefix_text):]
        self._prefix = self._read = len(self._ids)
        return text


def make_detokenizer(tokenizer: Any, skip_special_tokens: bool) -> IncrementalDetokenizer:
    """The fast detokenizer when the tokenizer has a Rust backend, else the slow one."""
    if getattr(tokenizer, "backend_tokenizer", None) is not None:
        return FastDetokenizer(tokenizer, skip_special_tokens)
    return SlowDetokenizer(tokenizer, skip_special_tokens)

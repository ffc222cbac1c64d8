"""Incremental detokenization: one sample's text, grown token by token in O(1) amortized.

Re-decoding a whole sequence per token costs O(n) per token. Instead, as vLLM's fast
incremental detokenizer does, each id is fed to ``tokenizers.decoders.DecodeStream``,
which keeps the last emitted token as a prefix and yields text once it forms complete
UTF-8. The tokenizer is always a fast one (``engine.tokenizer``: tokenizer.json's Rust
backend), so there is no slow path.

The bytes of a character split across tokens are held back (no U+FFFD in a delta for
valid text), and ``flush`` emits what is still held when generation ends, so the
concatenated pieces equal ``tokenizer.decode(all ids)``. The text is decoded from the
sample's own tokens (not primed with the prompt), as kvscope always has.
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Text of one token stream; ``add`` returns the text that token made decodable."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._skip = skip_special_tokens
        self._new_stream = lambda: DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stream = self._new_stream()
        self._pending: list[int] = []  # ids fed since the stream last emitted text

    def add(self, token_id: int) -> str:
        """Feed one id; the newly complete text ("" while a character is unfinished)."""
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
        """The text of ids still held back (a character that never completed)."""
        text = self._tokenizer.decode(self._pending, skip_special_tokens=self._skip) if self._pending else ""
        self._pending = []
        return text

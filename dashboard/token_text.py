"""Token ids → text for hovers, without transformers or torch.

The engine names its tokenizer file in the run config (``tokenizer_file``,
from ``engine.describe()``); the Rust ``tokenizers`` package decodes with it.
A run from elsewhere (file missing) simply shows token ids.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any


@functools.lru_cache(maxsize=8)
def _load(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def token_text_for(config: dict[str, Any] | None) -> Callable[[list[int]], str] | None:
    """A decoder for the run's tokenizer, or None when it cannot be found."""
    path = (config or {}).get("tokenizer_file")
    if not path or not os.path.isfile(path):
        return None
    try:
        tok = _load(path)
    except Exception:  # a corrupt or foreign file: hovers fall back to ids
        return None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def token_counter_for(config: dict[str, Any] | None) -> Callable[[str], int] | None:
    """How many tokens the engine makes of a text prompt (its tokenizer, special tokens
    as a plain prompt gets them), or None when the tokenizer cannot be found."""
    path = (config or {}).get("tokenizer_file")
    if not path or not os.path.isfile(path):
        return None
    try:
        tok = _load(path)
    except Exception:
        return None
    return lambda text: len(tok.encode(text).ids)

"""The Submit form's checks, run before anything is sent (pure: values in, messages out).

Each message names the field it belongs to and the allowed range, so the page shows
it beside that field; nothing out of range is sent and nothing fails silently. The
ranges come from the running engine (hello config and limits): max_tokens within
max_model_len, n within the server's ``max_n``, the whole frame within
``max_frame_bytes``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

DEFAULT_MAX_N = 64
DEFAULT_FRAME_BYTES = 1 << 20
TOP_K_MAX = 1_000_000


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def frame_bytes(prompt: str | None, messages: list[dict[str, str]] | None,
                params: dict[str, Any]) -> int:
    """Bytes of the submit frame these make (the server's size rule counts UTF-8)."""
    op: dict[str, Any] = {"type": "submit", "params": params, "request_id": "r-000000000000"}
    if prompt is not None:
        op["prompt"] = prompt
    else:
        op["messages"] = messages
    return len(json.dumps(op).encode())


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB" if n >= 1 << 19 else f"{n / 1024:.0f} KB"


def validate(mode: str, prompt: str, system: str, user: str, params: dict[str, Any],
             config: dict[str, Any] | None, limits: dict[str, Any] | None,
             count_tokens: Callable[[str], int] | None = None) -> dict[str, str]:
    """field → what is wrong with it and what is allowed ({} when it may be sent).

    Fields: ``prompt``, ``user``, ``max_tokens``, ``n``, ``top_k``, ``size``."""
    config, limits = config or {}, limits or {}
    mml = int(config.get("max_model_len") or 2048)
    max_n = int(limits.get("max_n") or DEFAULT_MAX_N)
    max_frame = int(limits.get("max_frame_bytes") or DEFAULT_FRAME_BYTES)
    errors: dict[str, str] = {}
    if mode == "Prompt" and not prompt.strip():
        errors["prompt"] = "Write a prompt: it may not be empty."
    if mode == "Chat" and not user.strip():
        errors["user"] = ("Write a user message: a chat needs one (the system message alone "
                          "would generate from the template).")
    mt = params.get("max_tokens")
    if not _int_in(mt, 1, mml - 1):
        errors["max_tokens"] = (f"max_tokens must be a whole number from 1 to {mml - 1} "
                                f"(max_model_len {mml} less at least one prompt token); "
                                f"got {mt}.")
    if not _int_in(params.get("n"), 1, max_n):
        errors["n"] = f"n must be from 1 to {max_n} on this server; got {params.get('n')}."
    if not _int_in(params.get("top_k"), 0, TOP_K_MAX):
        errors["top_k"] = f"top_k must be 0 (off) or a positive whole number; got {params.get('top_k')}."
    text = prompt if mode == "Prompt" else system + user
    size = frame_bytes(prompt if mode == "Prompt" else None,
                       None if mode == "Prompt" else [{"role": "system", "content": system},
                                                      {"role": "user", "content": user}], params)
    if size > max_frame:
        errors["size"] = (f"This request is {_mb(size)}; the server takes frames of at most "
                          f"{_mb(max_frame)} (hello.limits.max_frame_bytes). Shorten the text.")
    elif count_tokens is not None and text.strip() and "max_tokens" not in errors:
        n = count_tokens(text)
        if n + mt > mml:
            errors["size"] = (f"The text is about {n} tokens; with max_tokens {mt} that passes "
                              f"max_model_len {mml}. Shorten it or lower max_tokens.")
    return errors

"""The JSON of completion and chat responses and stream chunks, as OpenAI shapes them.

Plus vLLM's ``stop_reason`` on every choice (the stop string or token id that ended
it; null for EOS and length), and ``usage.prompt_tokens_details.cached_tokens``
always filled (the request's prefix-cache hit, in tokens). Pure functions of plain
values; ``choices`` decides what goes in them.
"""

from __future__ import annotations

from typing import Any

COMPLETION = "text_completion"
CHAT = "chat.completion"
CHAT_CHUNK = "chat.completion.chunk"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def envelope(rid: str, obj: str, created: int, model: str, choices: list[dict[str, Any]],
             use: dict[str, Any] | None = None) -> dict[str, Any]:
    """A response or chunk; ``usage`` only where given (a chunk without it has none)."""
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                           "choices": choices}
    if use is not None:
        out["usage"] = use
    return out


def completion_choice(index: int, text: str, logprobs: dict[str, Any] | None,
                      finish_reason: str | None, stop_reason: str | int | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


def chat_choice(index: int, content: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None, stop_reason: str | int | None) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": content},
            "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason}


def chat_delta(index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None,
               finish_reason: str | None = None,
               stop_reason: str | int | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason}


# ---- logprobs ---------------------------------------------------------------
# A token's entry from the engine: {token_id: logprob} for the top alternatives and
# the sampled token (CompletionOutput.logprobs[i]).

Token = tuple[str, list[int]]  # (string, bytes) from TokenStrings.token


def _ranked(entry: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: -kv[1])


def completion_logprobs(ids: list[int], entries: list[dict[int, float]], token, offset: int,
                        top_n: int) -> dict[str, Any]:
    """The completions format: parallel lists; ``text_offset`` counts characters from
    ``offset`` (the echoed prompt, if any). ``token(id)`` gives (string, bytes)."""
    tokens, lps, tops, offsets = [], [], [], []
    for tid, entry in zip(ids, entries):
        text = token(tid)[0]
        tokens.append(text)
        lps.append(entry.get(tid))
        # the top-n alternatives, and the sampled token when it is not among them (vLLM)
        ranked = _ranked(entry)
        top = dict((token(t)[0], lp) for t, lp in ranked[:top_n])
        top.setdefault(text, entry.get(tid))
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def chat_logprobs(ids: list[int], entries: list[dict[int, float]], token, top_n: int) -> dict[str, Any]:
    """The chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}``."""
    content = []
    for tid, entry in zip(ids, entries):
        text, raw = token(tid)
        top = [{"token": token(t)[0], "logprob": lp, "bytes": token(t)[1]}
               for t, lp in _ranked(entry)[:top_n]]
        content.append({"token": text, "logprob": entry.get(tid), "bytes": raw, "top_logprobs": top})
    return {"content": content}

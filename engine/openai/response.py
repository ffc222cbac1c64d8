"""The JSON of completion and chat responses and stream chunks, in vLLM 0.32's shapes.

The same keys at every level as ``vllm serve`` answers (``tests/vllm/test_openai_bodies.py``
sends both the same requests): OpenAI's, vLLM's ``stop_reason`` on every choice (the stop
string or token id that ended it; null for EOS and length), ``token_ids`` /
``prompt_token_ids`` (``return_token_ids``), ``prompt_logprobs``, and the fields vLLM
fills for features kvscope does not have (``routed_experts``, ``kv_transfer_params``, a
message's ``refusal`` ...), always null here. A whole answer lists every field; a stream
chunk only those vLLM sets (pydantic's ``exclude_unset``), so a chunk's keys vary as
vLLM's do. ``usage.prompt_tokens_details.cached_tokens`` is always filled (the request's
prefix-cache hit, in tokens). Pure functions of plain values; ``choices`` decides what
goes in them.
"""

from __future__ import annotations

from typing import Any

COMPLETION = "text_completion"
CHAT = "chat.completion"
CHAT_CHUNK = "chat.completion.chunk"
SYSTEM_FINGERPRINT = "kvscope"  # vLLM: "vllm-<version>-<hash of its config>"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, chat: bool = False,
          final: bool = False) -> dict[str, Any]:
    """A whole answer's usage (``final``: a stream's last chunk, which lists only what is set)."""
    details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if chat:
        details["created_cache_tokens"] = 0  # vLLM's chat fills it (KV connectors); 0 without
    elif not final:
        details["created_cache_tokens"] = None
    if not final:
        details["multimodal_tokens"] = None
    out = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
           "completion_tokens": completion_tokens, "prompt_tokens_details": details}
    if not final:
        out["completion_tokens_details"] = None
    return out


def running_usage(prompt_tokens: int, completion_tokens: int, chat: bool) -> dict[str, Any]:
    """``continuous_usage_stats``: a chunk's usage so far (its choice's tokens)."""
    out = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
           "completion_tokens": completion_tokens}
    if chat:
        out["completion_tokens_details"] = None
    return out


def envelope(rid: str, obj: str, created: int, model: str, choices: list[dict[str, Any]],
             use: dict[str, Any] | None = None, chat_prompt: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """A whole answer; chat's carries the prompt's ``chat_prompt`` (prompt_logprobs,
    prompt_token_ids, prompt_text) at the top."""
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                           "choices": choices, "service_tier": None,
                           "system_fingerprint": SYSTEM_FINGERPRINT, "usage": use}
    if obj == CHAT:
        out.update(chat_prompt or {"prompt_logprobs": None, "prompt_token_ids": None})
        out["prompt_text"] = None
    out.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return out


def chunk(rid: str, obj: str, created: int, model: str, choices: list[dict[str, Any]],
          use: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A stream chunk: ``usage`` only where given; ``extra`` after it (the usage chunk's
    ``system_fingerprint``, chat's first chunk's ``prompt_token_ids``)."""
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                           "choices": choices}
    if use is not None:
        out["usage"] = use
    out.update(extra)
    return out


def completion_choice(index: int, text: str, logprobs: dict[str, Any] | None,
                      finish_reason: str | None, stop_reason: str | int | None,
                      token_ids: list[int] | None = None, prompt_logprobs: list | None = None,
                      prompt_token_ids: list[int] | None = None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "token_ids": token_ids, "prompt_logprobs": prompt_logprobs,
            "prompt_token_ids": prompt_token_ids, "routed_experts": None}


def completion_chunk_choice(index: int, text: str, logprobs: dict[str, Any] | None,
                            finish_reason: str | None, stop_reason: str | int | None,
                            prompt_token_ids: list[int] | None, token_ids: list[int] | None
                            ) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "prompt_token_ids": prompt_token_ids, "token_ids": token_ids}


def chat_choice(index: int, content: str, logprobs: dict[str, Any] | None,
                finish_reason: str | None, stop_reason: str | int | None,
                token_ids: list[int] | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
               "audio": None, "function_call": None, "reasoning": None}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "token_ids": token_ids, "routed_experts": None}


def chat_delta(index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None,
               finish_reason: str | None = None, stop_reason: str | int | None = None,
               token_ids: list[int] | None = None, role: bool = False) -> dict[str, Any]:
    """A chat chunk's choice as vLLM sets it: the role chunk has no ``token_ids``; a
    content chunk has them (null without ``return_token_ids``); ``stop_reason`` only on
    the chunk that finishes."""
    out = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if not role:
        out["token_ids"] = token_ids
    if finish_reason is not None:
        out["stop_reason"] = stop_reason
    return out


# ---- logprobs ---------------------------------------------------------------
# A token's entry from the engine: {token_id: logprob} for the top alternatives and
# the sampled token (CompletionOutput.logprobs[i]).

Token = tuple[str, list[int]]  # (string, bytes) from TokenStrings.token


def _ranked(entry: dict[int, float]) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: -kv[1])


def completion_logprobs(ids: list[int], entries: list[dict[int, float] | None], token, offset: int,
                        top_n: int) -> dict[str, Any]:
    """The completions format: parallel lists; ``text_offset`` counts characters from
    ``offset``. ``token(id)`` gives (string, bytes). An entry of None (the first prompt
    token of an echo: nothing precedes it) has a null logprob and null alternatives."""
    tokens, lps, tops, offsets = [], [], [], []
    for tid, entry in zip(ids, entries):
        text = token(tid)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(entry.get(tid))
        # the top-n alternatives, and the sampled token when it is not among them (vLLM)
        ranked = _ranked(entry)
        top = dict((token(t)[0], lp) for t, lp in ranked[:top_n])
        top.setdefault(text, entry.get(tid))
        tops.append(top)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def prompt_logprob_entries(plp: list | None) -> list[dict[int, float] | None]:
    """``RequestOutput.prompt_logprobs`` as the sampled tokens' entries ({id: logprob},
    the token and its alternatives)."""
    return [None if e is None else {**dict(e.top_logprobs), e.token_id: e.logprob} for e in plp or ()]


def prompt_logprobs(plp: list | None, token) -> list[dict[str, Any] | None] | None:
    """vLLM's ``prompt_logprobs`` field: per prompt token null (the first) or
    ``{id: {logprob, rank, decoded_token}}``, the token first, then its alternatives."""
    if plp is None:
        return None
    out: list[dict[str, Any] | None] = []
    for e in plp:
        if e is None:
            out.append(None)
            continue
        entry = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank,
                                   "decoded_token": token(e.token_id)[0]}}
        for rank, (t, lp) in enumerate(e.top_logprobs, start=1):
            entry.setdefault(str(t), {"logprob": lp, "rank": rank, "decoded_token": token(t)[0]})
        out.append(entry)
    return out


def chat_logprobs(ids: list[int], entries: list[dict[int, float]], token, top_n: int) -> dict[str, Any]:
    """The chat format: ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}``."""
    content = []
    for tid, entry in zip(ids, entries):
        text, raw = token(tid)
        top = [{"token": token(t)[0], "logprob": lp, "bytes": token(t)[1]}
               for t, lp in _ranked(entry)[:top_n]]
        content.append({"token": text, "logprob": entry.get(tid), "bytes": raw, "top_logprobs": top})
    return {"content": content}

"""Completion and chat request bodies → ``ApiRequest`` (validated; pure Python).

Accepted, as OpenAI and vLLM define them: ``model``; ``prompt`` (a string, a list of
strings, token ids or a list of token-id lists) or ``messages`` (text content, the
chat template applied by the engine); ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``min_tokens``, ``seed``, ``n``,
``stop``, ``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``,
``skip_special_tokens``, ``logprobs`` (completions: how many alternatives; chat: a
bool with ``top_logprobs``), ``echo``, ``stream``, ``stream_options.include_usage``,
and vLLM's ``return_token_ids`` (each choice also carries its token ids) and
``return_tokens_as_token_ids`` (logprobs name tokens ``token_id:N``: distinct even where
two tokens decode to the same string, e.g. halves of characters).
JSON ``null`` means "the default".

Fields this engine cannot honour are refused with a 400 naming them, unless they
carry their neutral value (benchmarks send ``repetition_penalty: 1.0``): silently
ignoring a penalty would change results behind the caller's back. Everything else
(``user``, ``metadata``, vLLM's extras such as ``priority``) is ignored.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from engine.core.errors import SamplingParamsError
from engine.core.sampling_params import SamplingParams
from engine.openai.errors import ApiError, bad

# Known fields kvscope does not implement, with the value that means "off".
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1,
            "logit_bias": {}, "suffix": "", "tools": [], "functions": [], "use_beam_search": False,
            "prompt_logprobs": 0, "best_of": 1, "guided_json": None, "guided_regex": None,
            "guided_choice": None, "guided_grammar": None}


class Endpoint(str, enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class ParseLimits:
    max_n: int = 64  # samples per prompt (the server passes request_book.MAX_N)
    max_prompts: int = 64  # prompts per completion request (each is one engine request)
    max_logprobs: int = 20  # SamplingParams' bound


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One validated API call: ``prompts`` (completions) or ``messages`` (chat), each
    run as one engine request with ``params``; choice index = prompt index * n + sample."""

    endpoint: Endpoint
    model: str | None
    prompts: tuple[str | list[int], ...]
    messages: tuple[dict[str, str], ...] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool
    logprobs: int | None  # alternatives per token; None: no logprobs in the answer
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # return_tokens_as_token_ids

    @property
    def num_requests(self) -> int:
        return len(self.prompts) if self.endpoint is Endpoint.COMPLETIONS else 1


class _Body:
    """Typed reads of a JSON object; every failure is a 400 naming the field."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        self.d = body

    def get(self, name: str) -> Any:
        return self.d.get(name)

    def boolean(self, name: str, default: bool) -> bool:
        v = self.d.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise bad(f"{name} must be true or false, got {v!r}", name)
        return v

    def integer(self, name: str, default: int | None, lo: int | None = None,
                hi: int | None = None) -> int | None:
        v = self.d.get(name)
        if v is None:
            return default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad(f"{name} must be an integer, got {v!r}", name)
        if lo is not None and v < lo or hi is not None and v > hi:
            raise bad(f"{name} must be in [{lo if lo is not None else '-inf'}, "
                      f"{hi if hi is not None else 'inf'}], got {v}", name)
        return v

    def number(self, name: str, default: float) -> float:
        v = self.d.get(name)
        if v is None:
            return default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise bad(f"{name} must be a finite number, got {v!r}", name)  # json takes NaN, Infinity
        return float(v)

    def neutral(self) -> None:
        for name, off in _NEUTRAL.items():
            v = self.d.get(name)
            if v is not None and v != off:
                raise bad(f"{name} is not supported by kvscope (got {v!r}); leave it out or "
                          f"send {off!r}", name, "unsupported_parameter")


def _stop(b: _Body) -> list[str]:
    v = b.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop must be a non-empty string or a list of non-empty strings", "stop")
    return stops


def _token_ids(b: _Body, name: str) -> list[int]:
    v = b.get(name)
    if v is None:
        return []
    if not isinstance(v, list) or not all(type(t) is int and t >= 0 for t in v):
        raise bad(f"{name} must be a list of non-negative integer token ids", name)
    return v


def _stream(b: _Body) -> tuple[bool, bool]:
    stream = b.boolean("stream", False)
    opts = b.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    if not stream:
        raise bad("stream_options can only be given with stream: true", "stream_options")
    usage = opts.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad("stream_options.include_usage must be true or false", "stream_options")
    return stream, bool(usage)


def _params(b: _Body, limits: ParseLimits, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    # Ranges are SamplingParams' own (seed, top_k, max_tokens, ...; top_k against the
    # vocabulary at admission), so the API refuses exactly what the websocket does.
    kwargs = dict(
        n=b.integer("n", 1, 1, limits.max_n),
        temperature=b.number("temperature", 1.0),
        top_p=b.number("top_p", 1.0),
        top_k=b.integer("top_k", 0),
        min_p=b.number("min_p", 0.0),
        seed=b.integer("seed", None),
        max_tokens=max_tokens,
        min_tokens=b.integer("min_tokens", 0, 0),
        stop=_stop(b),
        stop_token_ids=_token_ids(b, "stop_token_ids"),
        ignore_eos=b.boolean("ignore_eos", False),
        include_stop_str_in_output=b.boolean("include_stop_str_in_output", False),
        skip_special_tokens=b.boolean("skip_special_tokens", True),
        logprobs=logprobs,
    )
    try:
        return SamplingParams(**kwargs)
    except SamplingParamsError as exc:  # range checks: the message starts with the field
        field = str(exc).split(" ", 1)[0]
        raise bad(str(exc), field if field in kwargs else None) from None


def _model(b: _Body) -> str | None:
    model = b.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"model must be a string, got {model!r}", "model")
    return model


def _max_tokens(b: _Body, name: str, default: int | None) -> int | None:
    v = b.integer(name, default, 0)
    if v == 0:
        raise bad(f"{name} must be >= 1: kvscope computes no prompt logprobs, so a request "
                  f"that generates nothing has nothing to return", name)
    return v


def _prompts(b: _Body, limits: ParseLimits) -> tuple[str | list[int], ...]:
    p = b.get("prompt")
    if isinstance(p, str):
        prompts: list = [p]
    elif isinstance(p, list) and p and all(type(t) is int for t in p):
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(
            isinstance(x, list) and x and all(type(t) is int for t in x) for x in p):
        prompts = list(p)
    else:
        raise bad("prompt must be a string, a list of strings, a list of token ids or a list of "
                  "token-id lists (none of them empty)", "prompt")
    if any(isinstance(x, str) and not x for x in prompts):
        raise bad("prompt must not be empty", "prompt")
    if any(isinstance(x, list) and any(t < 0 for t in x) for x in prompts):
        raise bad("token ids must be >= 0", "prompt")
    if len(prompts) > limits.max_prompts:
        raise bad(f"{len(prompts)} prompts in one request; this server takes at most "
                  f"{limits.max_prompts}", "prompt")
    return tuple(prompts)


def parse_completion(body: Any, limits: ParseLimits = ParseLimits()) -> ApiRequest:
    """Validate a ``POST /v1/completions`` body; raises ApiError (400) saying what is wrong."""
    b = _Body(body)
    b.neutral()
    prompts = _prompts(b, limits)
    logprobs = b.integer("logprobs", None, 0, limits.max_logprobs)
    echo = b.boolean("echo", False)
    if echo and logprobs is not None:
        raise bad("echo with logprobs needs the prompt's logprobs, which kvscope does not "
                  "compute; drop one of them", "echo")
    stream, usage = _stream(b)
    params = _params(b, limits, _max_tokens(b, "max_tokens", 16), logprobs)
    return ApiRequest(Endpoint.COMPLETIONS, _model(b), prompts, None, params, stream, usage,
                      echo, logprobs, b.boolean("return_token_ids", False),
                      b.boolean("return_tokens_as_token_ids", False))


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list):
        texts = []
        for part in c:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise bad(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                          f"are supported", "messages")
            texts.append(part["text"])
        return "\n".join(texts)  # as vLLM joins a message's text parts
    raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _messages(b: _Body) -> tuple[dict[str, str], ...]:
    msgs = b.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list of {role, content}", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string role", "messages")
        out.append({"role": m["role"], "content": _content(m, i)})
    return tuple(out)


def parse_chat(body: Any, limits: ParseLimits = ParseLimits()) -> ApiRequest:
    """Validate a ``POST /v1/chat/completions`` body; raises ApiError (400)."""
    b = _Body(body)
    b.neutral()
    fmt = b.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("response_format other than {'type': 'text'} is not supported by kvscope",
                  "response_format", "unsupported_parameter")
    messages = _messages(b)
    want = b.boolean("logprobs", False)
    top = b.integer("top_logprobs", None, 0, limits.max_logprobs)
    if top and not want:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (top or 0) if want else None
    name = "max_completion_tokens" if b.get("max_completion_tokens") is not None else "max_tokens"
    stream, usage = _stream(b)
    params = _params(b, limits, _max_tokens(b, name, None), logprobs)
    return ApiRequest(Endpoint.CHAT, _model(b), (), messages, params, stream, usage,
                      b.boolean("echo", False), logprobs, b.boolean("return_token_ids", False),
                      b.boolean("return_tokens_as_token_ids", False))


def check_model(model: str | None, served: tuple[str, ...]) -> None:
    """404 unless ``model`` is absent or one of the served names."""
    if model is not None and model not in served:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                            f"{served[0]!r} (GET /v1/models)", param="model", code="model_not_found")

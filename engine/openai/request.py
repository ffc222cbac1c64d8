"""Completion and chat request bodies → ``ApiRequest`` (validated; pure Python).

Over 300 lines on purpose: it answers for every field of vLLM's two request types
(below), and one reader per field, side by side with the tables of the rest, is what
lets a test hold the whole surface to vLLM's field lists.

Every field of vLLM 0.32's ``CompletionRequest`` and ``ChatCompletionRequest`` is one of
(``tests/vllm/test_openai_bodies.py`` holds this module to vLLM's own field lists):

- honoured, as OpenAI and vLLM define them: ``model`` (absent or ``""``: the served
  model); ``prompt`` (a string, a list of strings, token ids or a list of token-id lists)
  or ``messages`` (text content; roles system, developer, user, assistant; the chat
  template applied by the engine); ``max_tokens`` / ``max_completion_tokens`` (0 only
  with ``echo``: the prompt alone), ``temperature``, ``top_p``, ``top_k``, ``min_p``,
  ``min_tokens``, ``seed``, ``n``, ``stop``, ``stop_token_ids``, ``ignore_eos``,
  ``include_stop_str_in_output``, ``skip_special_tokens``, ``logprobs`` (completions: how
  many alternatives; chat: a bool with ``top_logprobs``), ``prompt_logprobs``, ``echo``
  (with ``logprobs`` on completions the prompt's logprobs too, as lm-eval's loglikelihood
  asks), ``logit_bias`` (clamped to [-100, 100] as vLLM does), ``allowed_token_ids``,
  ``truncate_prompt_tokens`` with ``truncation_side`` (keep the last k tokens, or the
  first k with "right"; -1: ``max_model_len`` - 1), ``stream``,
  ``stream_options.include_usage`` and ``.continuous_usage_stats`` (usage in every
  chunk), ``response_format`` ``{"type": "text"}``, and vLLM's ``return_token_ids`` (the
  prompt's and each choice's token ids) and ``return_tokens_as_token_ids`` (logprobs
  name tokens ``token_id:N``: distinct even where two tokens decode to the same string);
- not implemented, and accepted only with the value that means "off" (``_NEUTRAL``:
  benchmarks send ``repetition_penalty: 1.0``); any other value is a 400 naming it, since
  ignoring it would change results behind the caller's back (``structured_outputs`` and
  a ``response_format`` other than text included);
- without effect on what vLLM computes either (``_NO_EFFECT``: ``user``, ``metadata``,
  and the like): accepted.

Any other field is a 400 naming it (vLLM's server ignores unknown fields with a log
line; kvscope ignores nothing). JSON ``null`` means "the default" everywhere.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from engine.core.errors import SamplingParamsError
from engine.core.sampling_params import MAX_LOGPROBS, SamplingParams
from engine.openai.errors import ApiError, bad

UNSUPPORTED = "unsupported_parameter"

# Known fields kvscope does not implement, with the values that mean "off".
_NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,),
    "suffix": ("",), "use_beam_search": (False,), "best_of": (1,), "length_penalty": (1,),
    "watermarking": (False,), "spaces_between_special_tokens": (True,), "bad_words": ([],),
    "logprob_token_ids": ([],), "prompt_embeds": (), "structured_outputs": (), "priority": (0,),
    "routed_experts_prompt_start": (0,), "return_token_offsets": (False,),
    "return_mm_kwargs": (False,), "mm_payload": ("tensors",), "cache_salt": (),
    "kv_transfer_params": (), "ec_transfer_params": (), "vllm_xargs": ({},),
    "repetition_detection": (), "thinking_token_budget": (), "stream_interval": (1,),
    "request_id": (), "session_id": (), "functions": ([],), "function_call": (),
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
}
_CHAT_NEUTRAL: dict[str, tuple] = {
    "tools": ([],), "tool_choice": ("none",), "reasoning_effort": (),
    "add_generation_prompt": (True,), "continue_final_message": (False,),
    "add_special_tokens": (False,), "documents": ([],), "chat_template": (),
    "chat_template_kwargs": ({},), "media_io_kwargs": ({},), "mm_processor_kwargs": ({},),
    "return_prompt_text": (False,), "audio": (), "modalities": (["text"],), "prediction": (),
    "web_search_options": (),
}
_COMPLETION_NEUTRAL: dict[str, tuple] = {"add_special_tokens": (True,)}
# Fields that change nothing vLLM computes for a text model without tools or a reasoning
# parser (OpenAI's bookkeeping; the reasoning and tool-call switches).
_NO_EFFECT = frozenset({"user", "metadata", "store", "service_tier", "include_reasoning",
                        "parallel_tool_calls"})
_COMMON = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "min_tokens", "seed", "n",
    "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
    "logprobs", "prompt_logprobs", "echo", "logit_bias", "allowed_token_ids",
    "truncate_prompt_tokens", "truncation_side", "stream", "stream_options", "response_format",
    "return_token_ids", "return_tokens_as_token_ids"})
_COMPLETION_FIELDS = _COMMON | {"prompt"}
_CHAT_FIELDS = _COMMON | {"messages", "top_logprobs", "max_completion_tokens"}


class Endpoint(str, enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class ParseLimits:
    max_n: int = 64  # samples per prompt (the server passes request_book.MAX_N)
    max_prompts: int = 64  # prompts per completion request (each is one engine request)
    max_logprobs: int = MAX_LOGPROBS  # SamplingParams' bound


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
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (with include_usage)
    echo_only: bool = False  # echo with max_tokens 0: the answer is the prompt alone
    truncate: int | None = None  # truncate_prompt_tokens (-1: max_model_len - 1)
    truncation_side: str = "left"  # left: keep the last tokens (vLLM's default for generation)

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

    def known(self, fields: frozenset[str], neutral: dict[str, tuple]) -> None:
        """Refuse what kvscope cannot honour: a not-implemented field with a value other
        than its "off" one, and any field it does not know."""
        for name, v in self.d.items():
            if v is None or name in fields or name in _NO_EFFECT:
                continue
            off = neutral.get(name, _NEUTRAL.get(name))
            if off is None:
                raise bad(f"{name} is not a parameter kvscope knows; leave it out (nothing is "
                          f"silently ignored)", name, UNSUPPORTED)
            if v not in off:
                hint = f"leave it out or send {off[0]!r}" if off else "leave it out"
                raise bad(f"{name} is not supported by kvscope (got {v!r}); {hint}", name,
                          UNSUPPORTED)


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


def _stream(b: _Body) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats)."""
    stream = b.boolean("stream", False)
    opts = b.get("stream_options")
    if opts is None:
        return stream, False, False
    if not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    if not stream:
        raise bad("stream_options can only be given with stream: true", "stream_options")
    flags = []
    for key in ("include_usage", "continuous_usage_stats"):
        v = opts.get(key)
        if v is not None and not isinstance(v, bool):
            raise bad(f"stream_options.{key} must be true or false", "stream_options")
        flags.append(bool(v))
    other = set(opts) - {"include_usage", "continuous_usage_stats"}
    if other:
        raise bad(f"stream_options.{sorted(other)[0]} is not supported by kvscope", "stream_options",
                  UNSUPPORTED)
    usage, continuous = flags
    return stream, usage, usage and continuous  # vLLM: continuous only with include_usage


def _logit_bias(b: _Body) -> dict[int, float] | None:
    v = b.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("logit_bias must be an object of token id to bias", "logit_bias")
    out = {}
    for k, bias in v.items():
        try:
            tid = int(k)
        except ValueError:
            raise bad(f"logit_bias contains key(s) that cannot be converted to integer token "
                      f"IDs: {[k]!r}", "logit_bias") from None
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not math.isfinite(bias):
            raise bad(f"logit_bias[{k!r}] must be a finite number, got {bias!r}", "logit_bias")
        out[tid] = min(100.0, max(-100.0, float(bias)))  # as vLLM clamps
    return out


def _truncation(b: _Body) -> tuple[int | None, str]:
    k = b.integer("truncate_prompt_tokens", None, -1)
    side = b.get("truncation_side")
    if side is not None and side not in ("left", "right"):
        raise bad("`truncation_side` must be either 'left' or 'right'.", "truncation_side")
    return k, side or "left"


def _params(b: _Body, limits: ParseLimits, max_tokens: int | None, logprobs: int | None,
            prompt_logprobs: int | None) -> SamplingParams:
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
        prompt_logprobs=prompt_logprobs,
        allowed_token_ids=b.get("allowed_token_ids"),
        logit_bias=_logit_bias(b),
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
    return model or None  # "": the served model, as vLLM answers it


def _max_tokens(b: _Body, name: str, default: int | None, echo: bool = False) -> int | None:
    v = b.integer(name, default, 0)
    if v == 0 and not echo:
        raise bad(f"{name} must be >= 1 (0 only with echo, for the prompt alone)", name)
    return v


def _prompt_logprobs(b: _Body, stream: bool, limits: ParseLimits) -> int | None:
    v = b.integer("prompt_logprobs", None, 0, limits.max_logprobs)
    if v and stream:
        raise bad("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    return v


def _response_format(b: _Body) -> None:
    fmt = b.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad("response_format other than {'type': 'text'} is not supported by kvscope "
                  "(it has no structured outputs)", "response_format", UNSUPPORTED)


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
    b.known(_COMPLETION_FIELDS, _COMPLETION_NEUTRAL)
    _response_format(b)
    prompts = _prompts(b, limits)
    logprobs = b.integer("logprobs", None, 0, limits.max_logprobs)
    echo = b.boolean("echo", False)
    stream, usage, continuous = _stream(b)
    prompt_logprobs = _prompt_logprobs(b, stream, limits)
    if prompt_logprobs is None and echo:
        prompt_logprobs = logprobs  # vLLM: the echoed prompt's tokens get logprobs too
    max_tokens = _max_tokens(b, "max_tokens", 16, echo)
    # echo with max_tokens 0: vLLM generates one token and answers with the prompt alone
    params = _params(b, limits, max_tokens or 1, logprobs, prompt_logprobs)
    truncate, side = _truncation(b)
    return ApiRequest(Endpoint.COMPLETIONS, _model(b), prompts, None, params, stream, usage,
                      echo, logprobs, b.boolean("return_token_ids", False),
                      b.boolean("return_tokens_as_token_ids", False), continuous,
                      max_tokens == 0, truncate, side)


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
    b.known(_CHAT_FIELDS, _CHAT_NEUTRAL)
    _response_format(b)
    messages = _messages(b)
    want = b.boolean("logprobs", False)
    top = b.integer("top_logprobs", None, 0, limits.max_logprobs)
    if top and not want:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (top or 0) if want else None
    name = "max_completion_tokens" if b.get("max_completion_tokens") is not None else "max_tokens"
    stream, usage, continuous = _stream(b)
    params = _params(b, limits, _max_tokens(b, name, None), logprobs, _prompt_logprobs(b, stream, limits))
    truncate, side = _truncation(b)
    return ApiRequest(Endpoint.CHAT, _model(b), (), messages, params, stream, usage,
                      b.boolean("echo", False), logprobs, b.boolean("return_token_ids", False),
                      b.boolean("return_tokens_as_token_ids", False), continuous, False,
                      truncate, side)


def check_model(model: str | None, served: tuple[str, ...]) -> None:
    """404 unless ``model`` is absent or one of the served names."""
    if model is not None and model not in served:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves "
                            f"{served[0]!r} (GET /v1/models)", param="model", code="model_not_found")

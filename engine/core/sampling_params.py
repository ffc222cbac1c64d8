"""SamplingParams: how to sample one request (vLLM-shaped). Plain Python.

Also the one definition of "greedy" (``is_greedy``): the sampler asks it too.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

from engine.core.errors import SamplingParamsError

# Temperatures below this mean argmax (vLLM's _SAMPLING_EPS): dividing logits by a
# temperature this small would overflow float32 anyway.
GREEDY_TEMPERATURE = 1e-5
SEED_LIMIT = 1 << 64  # seeds feed a 64-bit generator: [0, 2**64)
# vLLM's API takes any int64 seed (``ge=-2**63``), and torch's manual_seed maps a negative
# seed s to s + 2**64; accepted here and stored that way, so both ends agree.
SEED_MIN = -(1 << 63)
MAX_N = 128  # samples per request; OpenAI's limit for n
MAX_LOGPROBS = 20  # alternatives per token (vLLM's default --max-logprobs)
MAX_TOKENS_LIMIT = 1 << 20  # above any max_model_len one kvscope machine holds; bounds every count


def add_sampling_args(p: argparse.ArgumentParser, seed_flag: str = "--seed") -> None:
    """The sampling flags of ``kvscope generate`` and ``kvscope submit`` (``sampling_args``
    reads them); ``generate`` names its seed ``--sampling-seed`` (``--seed`` is the engine's)."""
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: 0, greedy, for one sample; 1.0 when "
                        "--n > 1, since greedy samples of one prompt are all the same)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(seed_flag, dest="sampling_seed", type=int, default=None)
    p.add_argument("--stop", action="append")


def sampling_args(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams' fields from ``add_sampling_args``' flags (the temperature as its help says)."""
    temperature = args.temperature if args.temperature is not None else 1.0 if args.n > 1 else 0.0
    return {"n": args.n, "temperature": temperature, "top_p": args.top_p, "max_tokens": args.max_tokens,
            "seed": args.sampling_seed, "stop": args.stop or []}


def is_greedy(temperature: float) -> bool:
    """Whether a row with this temperature is sampled by argmax (the one definition)."""
    return temperature < GREEDY_TEMPERATURE


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings, validated on construction.

    ``temperature`` below ``GREEDY_TEMPERATURE`` (0 in practice) is greedy. ``n > 1``
    gives n samples; how they share KV blocks is the engine's ``n_sharing``
    (``engine.core.config.N_SHARING_MODES``). Every numeric field is range-checked here, so a value that passes
    cannot overflow anywhere later (issue 17); ``top_k`` against the vocabulary is the
    engine's check, since only it knows the vocabulary.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    # vLLM's: the logprob of every prompt token after the first (and the top n), from the
    # prefill's logits; a request asking for them computes its whole prompt (no prefix hit)
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None  # sample only among these (the rest masked)
    logit_bias: dict[int, float] | None = None  # added to the logits before sampling

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):  # a dict or a string would iterate as a list
            if getattr(self, name) is not None and not isinstance(getattr(self, name), (list, tuple)):
                raise SamplingParamsError(f"{name} must be a list, got {getattr(self, name)!r}")
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.allowed_token_ids is not None and not isinstance(self.allowed_token_ids, (list, tuple)):
            raise SamplingParamsError(f"allowed_token_ids must be a list, got {self.allowed_token_ids!r}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise SamplingParamsError(f"logit_bias must be a map of token id to bias, got "
                                          f"{self.logit_bias!r}")
            try:  # JSON has string keys: {"50256": -100}
                self.logit_bias = {int(k): v for k, v in self.logit_bias.items()}
            except (TypeError, ValueError):
                raise SamplingParamsError(f"logit_bias keys must be token ids, got "
                                          f"{list(self.logit_bias)!r}") from None
        checks = [
            (_is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be an integer in [1, {MAX_N}], got {self.n!r}"),
            (_is_num(self.temperature) and self.temperature >= 0,
             f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}"),
            (_is_num(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}"),
            (_is_int(self.top_k) and self.top_k >= 0, f"top_k must be >= 0 (0 or -1 = off), got {self.top_k!r}"),
            (_is_num(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}"),
            (self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed < SEED_LIMIT),
             f"seed must be None or an integer in [-2**63, 2**64 - 1] (it seeds a 64-bit "
             f"generator), got {self.seed!r}"),
            (self.max_tokens is None or (_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_TOKENS_LIMIT),
             f"max_tokens must be None or an integer in [1, {MAX_TOKENS_LIMIT}], got {self.max_tokens!r}"),
            (_is_int(self.min_tokens) and 0 <= self.min_tokens <= MAX_TOKENS_LIMIT,
             f"min_tokens must be an integer in [0, {MAX_TOKENS_LIMIT}], got {self.min_tokens!r}"),
            (not (_is_int(self.min_tokens) and _is_int(self.max_tokens)) or self.min_tokens <= self.max_tokens,
             f"min_tokens ({self.min_tokens!r}) must not exceed max_tokens ({self.max_tokens!r})"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be a list of non-empty strings"),
            (all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be a list of non-negative integers"),
            (self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
             f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {self.logprobs!r}"),
            (self.prompt_logprobs is None or (_is_int(self.prompt_logprobs)
                                              and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
             f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got "
             f"{self.prompt_logprobs!r}"),
            (self.allowed_token_ids is None or (self.allowed_token_ids and all(
                _is_int(t) and t >= 0 for t in self.allowed_token_ids)),
             "allowed_token_ids must be a non-empty list of non-negative integers"),
            (self.logit_bias is None or all(
                k >= 0 and _is_num(v) and math.isfinite(v) for k, v in self.logit_bias.items()),
             "logit_bias must map non-negative token ids to finite numbers"),
        ]
        for ok, message in checks:
            if not ok:
                raise SamplingParamsError(message)
        if self.seed is not None and self.seed < 0:
            self.seed %= SEED_LIMIT  # two's complement, as torch.Generator.manual_seed reads it

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def check_vocab(self, vocab_size: int) -> None:
        """The checks only the engine can make, knowing the vocabulary (as vLLM's
        ``_validate_*``: every token id a parameter names indexes the logits)."""
        if self.top_k > vocab_size:
            raise SamplingParamsError(f"top_k must be at most the vocabulary size ({vocab_size}), "
                                      f"got {self.top_k}")
        for name in ("stop_token_ids", "allowed_token_ids", "logit_bias"):
            bad = [t for t in getattr(self, name) or () if t >= vocab_size]
            if bad:
                raise SamplingParamsError(f"{name} contain out-of-vocab token ids {bad}. "
                                          f"Vocabulary size: {vocab_size}")

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        """Build from a JSON dict; unknown keys are an error (a typo should not pass)."""
        unknown = set(d) - set(cls.__slots__)
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {sorted(unknown)}")
        try:
            return cls(**d)
        except TypeError as exc:  # wrong types that slip past the checks
            raise SamplingParamsError(str(exc)) from exc


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

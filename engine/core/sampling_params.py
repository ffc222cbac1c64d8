"""SamplingParams: how to sample one request (vLLM-shaped). Plain Python."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import SamplingParamsError


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings, validated on construction.

    ``temperature == 0`` is greedy. ``n > 1`` forks the request after its prompt
    is prefilled: the children share every KV block copy-on-write.
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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (_is_int(self.n) and self.n >= 1, f"n must be an integer >= 1, got {self.n!r}"),
            (_is_num(self.temperature) and self.temperature >= 0,
             f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}"),
            (_is_num(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}"),
            (_is_int(self.top_k) and 0 <= self.top_k < (1 << 63),  # the sampler makes an int64 tensor
             f"top_k must be >= 0 (0 or -1 = off) and fit 64 bits, got {self.top_k!r}"),
            (_is_num(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}"),
            (self.seed is None or (_is_int(self.seed) and -(1 << 63) <= self.seed < (1 << 63)),
             f"seed must be a 64-bit signed integer or None, got {self.seed!r}"),
            (self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
             f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}"),
            (_is_int(self.min_tokens) and self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens!r}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop must be a list of non-empty strings"),
            (all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
             "stop_token_ids must be a list of non-negative integers"),
            (self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
             f"logprobs must be an integer in [0, 20] or None, got {self.logprobs!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise SamplingParamsError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

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

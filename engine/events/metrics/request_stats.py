"""Per-request figures a step hands to metrics consumers (Prometheus, benchmarks).

Plain Python, JSON round trip. Writer: the engine's output processor builds them when a
request gets its first token (``FirstTokenStats``) and when it finishes
(``FinishedRequestStats``); ``MetricsTracker.update`` puts them in the step's metrics
dict as ``first_tokens`` and ``finished_requests`` (lists of ``to_dict()``), so the
server's /metrics, the recorder and replay all see the same figures.

Times are seconds from ``time.time()``; intervals follow vLLM v1's definitions
(``vllm/v1/metrics/stats.py``): queued = first scheduled − arrival, prefill = first
token − first scheduled, decode = last token − first token, inference = last token −
first scheduled, e2e = finished − arrival.

A request with ``n > 1`` is one group here (one ``RequestOutput``): token counts sum
over its samples and ``max_num_generation_tokens`` is the longest sample.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FirstTokenStats:
    """A request produced its first token this step (its prefill is done)."""

    request_id: str
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache (first admission)
    ttft_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FirstTokenStats:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True)
class FinishedRequestStats:
    """A request finished (stop, length or abort) this step."""

    request_id: str
    finish_reason: str  # "stop" | "length" | "abort"
    num_prompt_tokens: int
    num_generation_tokens: int  # summed over the request's samples
    max_num_generation_tokens: int  # the longest sample
    n: int  # SamplingParams.n
    max_tokens: int | None  # SamplingParams.max_tokens as asked (None: up to max_model_len)
    num_cached_tokens: int  # prefix-cache hit at first admission
    prefill_kv_computed_tokens: int  # num_prompt_tokens - num_cached_tokens
    e2e_s: float
    queued_s: float | None  # None: never scheduled (aborted while waiting)
    prefill_s: float | None  # None: no token produced
    decode_s: float | None
    inference_s: float | None
    mean_time_per_output_token_s: float | None  # decode_s / (tokens - 1); None below 2 tokens
    # times preempted, summed over the request's samples (0 in recordings made before it existed)
    num_preemptions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FinishedRequestStats:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

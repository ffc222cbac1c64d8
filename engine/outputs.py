"""What generate() returns and what the server streams (vLLM-shaped).

Written by the output processor (engine/output_processor), one ``RequestOutput`` per
request touched in a step. While a request runs, a sample's ``token_ids`` is the core's
read-only live view of its tokens and ``logprobs`` the processor's own list (both grow
with later steps, and making them costs O(1)); the finished output holds a plain list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from engine.core.model_runner_output import PromptTokenLogprob


@dataclass(slots=True)
class CompletionOutput:
    """One sample of a request (``n > 1`` gives several)."""

    index: int
    text: str
    token_ids: Sequence[int]  # a list once finished; before, a live read-only view
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    stop_reason: str | int | None = None  # the stop string or token that matched
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's milestones."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    # per sample index: text / tokens added since the previous RequestOutput
    deltas: dict[int, tuple[str, list[int]]] = field(default_factory=dict)
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first
    # (nothing precedes it), as vLLM's; complete once the first token is out
    prompt_logprobs: list[PromptTokenLogprob | None] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for c, out in zip(d["outputs"], self.outputs):
            c["token_ids"] = list(out.token_ids)
            c["logprobs"] = None if out.logprobs is None else [dict(e) for e in out.logprobs]
        d["deltas"] = {str(k): {"text": t, "token_ids": ids} for k, (t, ids) in self.deltas.items()}
        return d

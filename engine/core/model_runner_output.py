"""What the model runner hands back to the scheduler for one step (typed, plain Python).

The core's side of the seam, so ``Scheduler.update_from_output`` needs no torch: the
runner fills it, the scheduler reads it (vLLM's ``ModelRunnerOutput``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SampledToken:
    """One sampled token; ``logprob`` and ``top_logprobs`` only where the request asked."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None


@dataclass(frozen=True, slots=True)
class PromptTokenLogprob:
    """One prompt token's logprob given the tokens before it (vLLM's prompt logprobs):
    its ``rank`` in that distribution (1 = most likely) and the top alternatives."""

    token_id: int
    logprob: float
    rank: int
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    """``sampled[rid]``: the token sampled for each id in the step's ``sample_ids``;
    ``prompt_logprobs[rid]``: the prompt tokens' logprobs this step's chunk computed,
    for requests that ask (``ScheduledRequest.prompt_logprob_targets``)."""

    sampled: dict[str, SampledToken] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[PromptTokenLogprob]] = field(default_factory=dict)

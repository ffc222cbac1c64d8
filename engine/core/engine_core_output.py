"""What the core reports after one step, for the output processor (typed, plain Python).

vLLM's ``EngineCoreOutput(s)``: one entry per request scheduled in the step, written
by ``Scheduler.update_from_output`` and read by the output processor, which turns
them into text, timings and ``RequestOutput``s. The core stays the only writer of
tokens and status; these entries only report them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.model_runner_output import PromptTokenLogprob, SampledToken


@dataclass(frozen=True, slots=True)
class EngineCoreOutput:
    """One scheduled request (a fork child is its own entry) after the step.

    ``new_token`` is None for a prefill chunk that sampled nothing (only what the step
    made crosses: the output processor keeps each sample's tokens). ``finish_reason`` ("length" | "stop") and ``stop_token`` are set
    when the core finished it this step. ``num_cached_tokens`` is the prefix-cache
    hit of the latest admission; ``num_preemptions`` how often the request was
    preempted so far (vLLM's ``request.num_preemptions``, for
    ``vllm:request_num_preemptions``). ``prompt_logprobs``: the prompt tokens' logprobs the
    step computed (only for a request that asks: None crosses otherwise), in order.
    """

    request_id: str
    parent_id: str | None
    sample_index: int
    new_token: SampledToken | None
    finish_reason: str | None = None
    stop_token: int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    prompt_logprobs: list[PromptTokenLogprob] | None = None

    @property
    def user_request_id(self) -> str:
        """The id the user submitted: the parent's for a fork child."""
        return self.parent_id if self.parent_id is not None else self.request_id


@dataclass(frozen=True, slots=True)
class EngineCoreOutputs:
    """Everything one step reports: its number, when it was scheduled (time.time()),
    and an entry per scheduled request."""

    step: int
    scheduled_at: float
    outputs: list[EngineCoreOutput] = field(default_factory=list)

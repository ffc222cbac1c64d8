"""What one core step produced (typed, plain Python): ``CoreStep``.

vLLM's ``EngineCoreOutputs``: ``Scheduler.update_from_output`` writes one
``EngineCoreOutput`` per request scheduled in the step; the engine core adds the step's
events, the pool summary and the fault, if part of the step failed; the output
processor turns the outputs into text, timings and ``RequestOutput``s. The core stays
the only writer of tokens and status; these entries only report them. The same value
crosses between the engine and a core in its own process
(``engine.engine_core.messages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.model_runner_output import PromptTokenLogprob, SampledToken

if TYPE_CHECKING:
    from engine.events.metrics.pool_summary import PoolSummary
    from engine.events.schema.types import Event


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
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    prompt_logprobs: list[PromptTokenLogprob] | None = None

    @property
    def user_request_id(self) -> str:
        """The id the user submitted: the parent's for a fork child."""
        return self.parent_id if self.parent_id is not None else self.request_id


@dataclass(frozen=True, slots=True)
class RequestFailure:
    """A request the engine failed because its own piece of a step raised (or read K/V
    of one that did). ``detail``: what raised, for the submitter and the log."""

    request_id: str  # the user request (a fork's parent), as abort_request takes it
    detail: str


@dataclass(frozen=True, slots=True)
class StepFault:
    """A step whose batched forward raised: what raised, and the requests failed for it
    (none when each ran alone without fault: the batch as a whole was the trouble)."""

    step: int
    detail: str
    failures: list[RequestFailure]


@dataclass(frozen=True, slots=True)
class CoreStep:
    """One step: ``step`` is the step it closed (None: a fault before the step closed
    failed its requests, and their events wait for the next step); ``scheduled_at``
    when it was scheduled (time.time()); one output per scheduled request. Filled in
    by ``EngineCore.step``: the step's events (empty when the engine keeps none), the
    pool summary (None unless asked for) and ``fault``: a forward or step that raised,
    with the requests failed for it (``engine.engine_core.core``)."""

    step: int | None
    scheduled_at: float
    outputs: list[EngineCoreOutput]
    events: list[Event] = field(default_factory=list)
    summary: PoolSummary | None = None
    fault: StepFault | None = None

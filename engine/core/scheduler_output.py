"""What the scheduler hands the model runner for one step (typed, plain Python).

Shaped like vLLM v1's ``SchedulerOutput``: a request's sampling settings travel once,
in ``new_requests``, the first time the runner must sample for it, and the runner drops
its state when the request id comes back in ``finished_request_ids``. Everything else
is per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.events.schema.types import ScheduledPhase


@dataclass(frozen=True, slots=True)
class NewRequestData:
    """A request the runner has not seen: what it needs to build its sampling state
    (vLLM's NewRequestData). Sent when the request is first admitted, and for a fork
    child in the step whose sampling creates it. ``seed`` seeds the row's generator
    (unused when ``params.greedy``)."""

    request_id: str
    params: SamplingParams
    seed: int


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of the step (read-only for everyone but the scheduler that
    builds it; not a frozen dataclass because one is built for every scheduled request of
    every step, and a frozen one's ``__init__`` costs three times as much: an
    ``object.__setattr__`` call per field).

    The runner feeds ``token_ids`` at positions ``start_position ..
    start_position + num_new_tokens - 1``, writes their K/V to ``slot_mapping``
    and attends through ``block_table`` over ``seq_len`` tokens. From the last
    position's logits it samples one token for each id in ``sample_ids``: empty for a
    prefill chunk that does not reach the end of the known tokens, this request alone
    normally, and at a fork point (``n > 1``) the request and its n - 1 children to be.
    For a request with ``prompt_logprobs``, the logits of positions
    ``prompt_logprobs_from ..`` give the logprobs of ``prompt_logprob_targets`` (the
    prompt tokens after them, each computed once even across preemptions).
    """

    request_id: str
    token_ids: list[int]
    start_position: int  # == num_computed_tokens before this step
    block_table: list[int]
    slot_mapping: list[int]
    sample_ids: tuple[str, ...]
    phase: ScheduledPhase
    prompt_logprob_targets: tuple[int, ...] = ()
    prompt_logprobs_from: int = 0

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.start_position + len(self.token_ids)

    @property
    def num_samples(self) -> int:
        return len(self.sample_ids)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """``step`` is the step number its events carry; ``timestamp`` (time.time()) is when
    it was scheduled, the "first scheduled" time of the requests it admits."""

    step: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    cow_pairs: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) block ids
    preempted: list[str] = field(default_factory=list)
    token_budget: int = 0
    new_requests: list[NewRequestData] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # since the previous step
    timestamp: float = 0.0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

"""What the scheduler hands the model runner for one step (typed, plain Python)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.events.types import ScheduledPhase


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's share of the step.

    The runner feeds ``token_ids`` at positions ``start_position ..
    start_position + num_new_tokens - 1``, writes their K/V to ``slot_mapping``
    and attends through ``block_table`` over ``seq_len`` tokens. It samples
    ``num_samples`` tokens from the last position's logits (0 for a prefill
    chunk that does not reach the end of the known tokens).
    """

    request_id: str
    token_ids: list[int]
    start_position: int  # == num_computed_tokens before this step
    block_table: list[int]
    slot_mapping: list[int]
    num_samples: int
    phase: ScheduledPhase

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    cow_pairs: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) block ids
    preempted: list[str] = field(default_factory=list)
    token_budget: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

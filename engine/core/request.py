"""A request's lifecycle and token bookkeeping (plain Python).

Writer: the Scheduler owns status and counters; the KVCacheManager owns the
request's block table (kept in the manager, not here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.events.request_status import RequestStatus

__all__ = ["Request", "RequestStatus"]


@dataclass(slots=True, eq=False)
class Request:
    """One sequence. A fork child (``n > 1``) is a Request with ``parent_id`` set.

    ``token_ids`` = prompt + generated tokens; ``num_computed_tokens`` of them have
    K/V in the cache; ``num_cached_tokens`` came from the prefix cache at the
    latest admission.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_index: int = 0
    arrival_time: float = 0.0
    eos_token_ids: tuple[int, ...] = ()
    parent_id: str | None = None
    sample_index: int = 0
    token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    forked: bool = False
    stop_token: int | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def sort_key(self) -> tuple[int, int]:
        """Arrival order; fork children sit right after their parent."""
        return (self.arrival_index, self.sample_index)

    def fork(self, sample_index: int) -> "Request":
        """A child sharing everything so far; its blocks are shared by the manager."""
        return Request(
            request_id=f"{self.request_id}#{sample_index}",
            prompt_token_ids=self.prompt_token_ids,
            params=self.params,
            arrival_index=self.arrival_index,
            arrival_time=self.arrival_time,
            eos_token_ids=self.eos_token_ids,
            parent_id=self.request_id,
            sample_index=sample_index,
            token_ids=list(self.token_ids),
            status=self.status,
            num_computed_tokens=self.num_computed_tokens,
            num_cached_tokens=self.num_cached_tokens,
            forked=True,
        )

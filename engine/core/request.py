"""A request's lifecycle and token bookkeeping (plain Python).

Writer: the Scheduler owns status, counters and the token lists (``update_from_output``
appends each sampled token: the only place ``token_ids`` grows); the KVCacheManager owns
the request's block table (kept in the manager, not here). Everyone else reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sampling_params import SEED_LIMIT, SamplingParams
from engine.events.schema.request_status import RequestStatus

__all__ = ["Request", "RequestStatus"]


def child_request_id(parent_id: str, sample_index: int) -> str:
    """The request id of sample ``sample_index`` of a fork: the one place it is made.

    Only a unique label (events and the dashboard show it); nothing parses it, since
    identity is ``Request.parent_id`` and ``Request.sample_index``. Unique because
    user request ids may not contain '#' (``engine.core.ids`` refuses them)."""
    return f"{parent_id}#{sample_index}"


@dataclass(slots=True, eq=False)
class Request:
    """One sequence. A fork child (``n > 1``) is a Request with ``parent_id`` set and
    its ``sample_index`` (1 .. n - 1; the parent is sample 0).

    ``token_ids`` = prompt + generated tokens; ``num_computed_tokens`` of them have
    K/V in the cache; ``num_cached_tokens`` came from the prefix cache at the
    latest admission. ``seed`` is the resolved seed of this sample's generator (the
    engine draws one when the user gave none); greedy requests carry it unused.
    ``num_preemptions``: how often this sample was preempted (a fork child counts its own).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_index: int = 0
    arrival_time: float = 0.0
    eos_token_ids: tuple[int, ...] = ()
    parent_id: str | None = None
    sample_index: int = 0
    seed: int = 0
    client: str = ""  # who submitted it (a front door's client key); the "fair" policy's unit
    token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_prompt_logprobs: int = 0  # prompt positions whose next-token logprob was reported
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
        """The generated tokens (a copy)."""
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def sort_key(self) -> tuple[int, int]:
        """Arrival order; fork children sit right after their parent."""
        return (self.arrival_index, self.sample_index)

    def child_seed(self, sample_index: int) -> int:
        """Sample k's seed: the parent's plus k, wrapped into 64 bits (never overflows)."""
        return (self.seed + sample_index) % SEED_LIMIT

    def fork(self, sample_index: int) -> "Request":
        """A child sharing everything so far; its blocks are shared by the manager."""
        return Request(
            request_id=child_request_id(self.request_id, sample_index),
            prompt_token_ids=self.prompt_token_ids,
            params=self.params,
            arrival_index=self.arrival_index,
            arrival_time=self.arrival_time,
            eos_token_ids=self.eos_token_ids,
            parent_id=self.request_id,
            sample_index=sample_index,
            seed=self.child_seed(sample_index),
            client=self.client,
            token_ids=list(self.token_ids),
            status=self.status,
            num_computed_tokens=self.num_computed_tokens,
            num_cached_tokens=self.num_cached_tokens,
            forked=True,
        )

"""One request as the reducer folds it: its lifecycle status and its block table.

Writer: the event rules in ``engine.events.rules`` (and ``PoolState`` when it is
built from a snapshot or copied).
"""

from __future__ import annotations

from dataclasses import dataclass

WAITING, RUNNING, PREEMPTED = "waiting", "running", "preempted"


@dataclass(slots=True, eq=False)
class RequestState:
    """A request's folded fields, in the snapshot's ``requests[rid]`` terms."""

    status: str
    table: list  # physical ids; None marks a hole awaiting its cow_copy
    num_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    token_ids: list[int]
    parent_id: str | None
    arrival_index: int

    def copy(self) -> RequestState:
        """An independent copy (fresh table and token list)."""
        return RequestState(self.status, list(self.table), self.num_tokens,
                            self.num_computed_tokens, self.num_cached_tokens,
                            list(self.token_ids), self.parent_id, self.arrival_index)

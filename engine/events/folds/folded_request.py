"""One request as the reducer folds it: its lifecycle status and its block table.

Writer: the event rules in ``engine.events.folds.rules`` (and ``PoolState`` when it is
built from a snapshot or copied).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events.folds.pool_snapshot import RequestView
from engine.events.schema.request_status import RequestStatus


@dataclass(slots=True, eq=False)
class FoldedRequest:
    """A request's folded fields, in ``RequestView`` terms."""

    status: RequestStatus
    table: list[int]  # physical block ids by logical index
    num_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    token_ids: list[int]
    parent_id: str | None
    arrival_index: int

    @classmethod
    def from_view(cls, r: RequestView) -> FoldedRequest:
        return cls(r.status, list(r.block_table), r.num_tokens, r.num_computed_tokens,
                   r.num_cached_tokens, list(r.token_ids or ()), r.parent_id, r.arrival_index)

    def view(self, request_id: str) -> RequestView:
        return RequestView(request_id, self.status, tuple(self.table), self.num_tokens,
                           self.num_computed_tokens, self.num_cached_tokens,
                           tuple(self.token_ids), self.parent_id, self.arrival_index)

    def copy(self) -> FoldedRequest:
        """An independent copy (fresh table and token list)."""
        return FoldedRequest(self.status, list(self.table), self.num_tokens,
                            self.num_computed_tokens, self.num_cached_tokens,
                            list(self.token_ids), self.parent_id, self.arrival_index)

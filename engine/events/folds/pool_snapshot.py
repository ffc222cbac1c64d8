"""``PoolSnapshot``: the pool and its requests at one moment, typed, with its JSON form.

The core builds one from the engine's true state (``Scheduler.snapshot``), the
reducer from folded events (``PoolState.to_snapshot``); after every step the two
are equal. The dashboard, the renderers, lessons and the store read it. It goes
over the websocket (``snapshot`` message) and into lesson documents as
``to_dict()``, whose shape is fixed::

    {"step", "block_size", "num_blocks",
     "blocks": [{"id", "ref_count", "hash", "num_tokens", "token_ids"}],  # by id
     "free_queue": [ids, head (reused next) first],
     "requests": {rid: {"status", "block_table", "num_tokens", "num_computed_tokens",
                        "num_cached_tokens", "token_ids", "parent_id", "arrival_index"}}}

A block's ``num_tokens`` is its filled slots: for a referenced block the fill of
``engine.events.metrics.pool_summary``; a free cached block is full; a free uncached one
holds nothing worth counting. ``token_ids`` may be None (a snapshot built
without tokens, or a block without a hash).

Writer: none (frozen values, built fresh each time; ``requests`` is a plain dict
to read, not to change).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.events.metrics.pool_summary import PoolSummary, fill_by_block, slots_filled
from engine.events.schema.request_status import RequestStatus


class BlockState(enum.StrEnum):
    """What a block is, for every view that colours or marks blocks."""

    FREE = "free"        # ref 0, no hash: nothing worth keeping
    CACHED = "cached"    # ref 0 with a hash: hittable until LRU eviction reuses it
    USED = "in use"      # ref 1
    SHARED = "shared"    # ref > 1 (prefix hit or fork)


@dataclass(frozen=True, slots=True)
class BlockView:
    id: int
    ref_count: int
    hash: str | None
    num_tokens: int  # filled slots
    token_ids: tuple[int, ...] | None

    @property
    def state(self) -> BlockState:
        if self.ref_count > 1:
            return BlockState.SHARED
        if self.ref_count == 1:
            return BlockState.USED
        return BlockState.CACHED if self.hash is not None else BlockState.FREE

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "ref_count": self.ref_count, "hash": self.hash,
                "num_tokens": self.num_tokens,
                "token_ids": list(self.token_ids) if self.token_ids is not None else None}


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    status: RequestStatus
    block_table: tuple[int, ...]  # logical index → physical block id
    num_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int  # from the prefix cache at the latest admission
    token_ids: tuple[int, ...] | None
    parent_id: str | None
    arrival_index: int

    def fill(self, logical_index: int, block_size: int) -> int:
        """Filled slots of this request's logical block ``logical_index``."""
        return slots_filled(self.num_computed_tokens, logical_index, block_size)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "block_table": list(self.block_table),
                "num_tokens": self.num_tokens, "num_computed_tokens": self.num_computed_tokens,
                "num_cached_tokens": self.num_cached_tokens,
                "token_ids": list(self.token_ids) if self.token_ids is not None else None,
                "parent_id": self.parent_id, "arrival_index": self.arrival_index}


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    step: int
    block_size: int
    num_blocks: int
    blocks: tuple[BlockView, ...]  # by id
    free_queue: tuple[int, ...]  # head (reused next) first
    requests: dict[str, RequestView]

    @classmethod
    def build(cls, step: int, block_size: int, ref_counts: Sequence[int],
              hashes: Sequence[str | None], block_token_ids: Sequence[tuple[int, ...] | None],
              free_queue: Iterable[int], requests: Iterable[RequestView]) -> PoolSnapshot:
        """Assemble a snapshot; block fills come from the requests' tables."""
        reqs = {r.request_id: r for r in requests}
        fill, _ = fill_by_block(((r.block_table, r.num_computed_tokens) for r in reqs.values()),
                                block_size)
        blocks = tuple(
            BlockView(i, ref, h, fill.get(i, 0) if ref > 0 else (block_size if h is not None else 0),
                      block_token_ids[i])
            for i, (ref, h) in enumerate(zip(ref_counts, hashes)))
        return cls(step, block_size, len(blocks), blocks, tuple(free_queue), reqs)

    # ---- reading ---------------------------------------------------------------

    def summary(self) -> PoolSummary:
        """The counts metrics need, from the blocks (see ``PoolSummary.from_tables``)."""
        used = filled = shared = cached_free = 0
        for b in self.blocks:
            if b.ref_count > 0:
                used += 1
                filled += b.num_tokens
                shared += b.ref_count > 1
            elif b.hash is not None:
                cached_free += 1
        statuses = [r.status for r in self.requests.values()]
        return PoolSummary(
            step=self.step, block_size=self.block_size, num_blocks=self.num_blocks,
            num_used_blocks=used, num_filled_slots=filled, num_shared_blocks=shared,
            num_cached_free_blocks=cached_free,
            num_requests_waiting=statuses.count(RequestStatus.WAITING),
            num_requests_running=statuses.count(RequestStatus.RUNNING),
            num_requests_preempted=statuses.count(RequestStatus.PREEMPTED))

    def by_arrival(self) -> list[RequestView]:
        """Requests in arrival order (fork children right after their parent's index)."""
        return sorted(self.requests.values(), key=lambda r: (r.arrival_index, r.request_id))

    def owners(self) -> dict[int, list[tuple[str, int]]]:
        """block id → [(request id, logical index)] of every table entry pointing at it."""
        out: dict[int, list[tuple[str, int]]] = {}
        for rid, r in self.requests.items():
            for i, b in enumerate(r.block_table):
                out.setdefault(b, []).append((rid, i))
        return out

    # ---- JSON ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The wire shape (module docstring); fresh lists, JSON-able."""
        return {"step": self.step, "block_size": self.block_size, "num_blocks": self.num_blocks,
                "blocks": [b.to_dict() for b in self.blocks],
                "free_queue": list(self.free_queue),
                "requests": {rid: r.to_dict() for rid, r in self.requests.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PoolSnapshot:
        """Inverse of ``to_dict``; raises ValueError on a malformed snapshot."""
        try:
            blocks = tuple(BlockView(int(b["id"]), int(b["ref_count"]), b.get("hash"),
                                     int(b["num_tokens"]), _ints(b.get("token_ids")))
                           for b in d["blocks"])
            requests = {rid: RequestView(
                rid, RequestStatus(r["status"]), tuple(r["block_table"]), int(r["num_tokens"]),
                int(r["num_computed_tokens"]), int(r.get("num_cached_tokens", 0)),
                _ints(r.get("token_ids", ())), r.get("parent_id"), int(r.get("arrival_index", 0)))
                for rid, r in d["requests"].items()}
            snap = cls(int(d.get("step", 0)), int(d["block_size"]), int(d["num_blocks"]), blocks,
                       tuple(d["free_queue"]), requests)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed pool snapshot: {exc!r}") from exc
        if [b.id for b in blocks] != list(range(snap.num_blocks)):
            raise ValueError(f"malformed pool snapshot: blocks must be listed by id 0.."
                             f"{snap.num_blocks - 1}")
        return snap


def _ints(values: Sequence[int] | None) -> tuple[int, ...] | None:
    return tuple(values) if values is not None else None

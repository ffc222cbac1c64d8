"""``HashCacheSnapshot``: what a hash-only KV event stream says each pod has cached.

The attach-mode twin of ``PoolSnapshot``: built by ``HashCacheState.to_snapshot``
from the ``kv_*`` events (``engine.events.schema.types``), sent in the ``snapshot``
message of an attached run and read by the dashboard and ``kvscope replay``.
A hash-only stream has no physical block ids, ref counts, block tables or
requests, so neither has this. Its JSON form (``kind`` tells it from a pool)::

    {"kind": "hash_cache", "step",
     "pods": {pod: {"segment", "block_size", "last_ts", "stored_blocks", "removed_blocks",
                    "unknown_removals", "clears",
                    "holes": [{"step", "segment", "first_seq", "last_seq", "reason"}],
                    "segments": [{"step", "segment", "first_seq", "reason"}],
                    "blocks": [{"hash", "parent", "medium", "token_ids", "lora_name",
                                "stored_step", "stored_ts", "last_access_ts", "reuses",
                                "copies"}]}}}

Blocks are in the order they were stored. Times are the source's clock.

Writer: none (frozen values, built fresh each time).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class CachedBlockView:
    """One cached block: its chained hash, its parent's, its tokens and when it was seen."""

    hash: str
    parent: str | None
    token_ids: tuple[int, ...]
    medium: str | None
    stored_step: int
    stored_ts: float
    last_access_ts: float  # the latest store that used it (see engine.events.metrics.residency)
    reuses: int = 0  # stores that certainly reused it (a branch stored below it)
    lora_name: str | None = None
    copies: int = 1  # physical blocks holding the hash (vLLM keeps recomputed duplicates)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.hash, "parent": self.parent, "medium": self.medium,
                "token_ids": list(self.token_ids), "lora_name": self.lora_name,
                "stored_step": self.stored_step, "stored_ts": self.stored_ts,
                "last_access_ts": self.last_access_ts, "reuses": self.reuses, "copies": self.copies}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CachedBlockView:
        return cls(str(d["hash"]), d.get("parent"), tuple(d["token_ids"]), d.get("medium"),
                   int(d["stored_step"]), float(d["stored_ts"]), float(d["last_access_ts"]),
                   int(d.get("reuses", 0)), d.get("lora_name"), int(d.get("copies", 1)))


@dataclass(frozen=True, slots=True)
class StreamHole:
    """Batches ``first_seq..last_seq`` of ``segment`` that never arrived (a ``kv_gap``)."""

    step: int
    segment: int
    first_seq: int
    last_seq: int
    reason: str

    @property
    def num_batches(self) -> int:
        return self.last_seq - self.first_seq + 1

    def describe(self) -> str:
        span = (f"batch {self.first_seq}" if self.first_seq == self.last_seq
                else f"batches {self.first_seq}..{self.last_seq}")
        return f"{span} of segment {self.segment} never arrived ({self.reason})"


@dataclass(frozen=True, slots=True)
class StreamSegment:
    """Where a segment of a pod's stream began (a ``kv_segment``)."""

    step: int
    segment: int
    first_seq: int
    reason: str


def _plain(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass(frozen=True, slots=True)
class PodCacheView:
    pod: str
    segment: int
    block_size: int | None  # the latest BlockStored's; None before any
    last_ts: float | None  # the latest source time seen from this pod
    blocks: tuple[CachedBlockView, ...]
    holes: tuple[StreamHole, ...] = ()
    segments: tuple[StreamSegment, ...] = ()
    stored_blocks: int = 0
    removed_blocks: int = 0
    unknown_removals: int = 0  # removals of hashes this fold never saw stored
    clears: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def incomplete(self) -> bool:
        """True when a hole in the current segment may have hidden stores or removals."""
        return any(h.segment == self.segment for h in self.holes)

    def hashes(self, medium: str | None = None, any_medium: bool = True) -> set[str]:
        """The cached hashes (of one medium unless ``any_medium``)."""
        return {b.hash for b in self.blocks if any_medium or b.medium == medium}

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.segment, "block_size": self.block_size, "last_ts": self.last_ts,
                "stored_blocks": self.stored_blocks, "removed_blocks": self.removed_blocks,
                "unknown_removals": self.unknown_removals, "clears": self.clears,
                "holes": [_plain(h) for h in self.holes],
                "segments": [_plain(s) for s in self.segments],
                "blocks": [b.to_dict() for b in self.blocks]}

    @classmethod
    def from_dict(cls, pod: str, d: dict[str, Any]) -> PodCacheView:
        return cls(pod, int(d.get("segment", 0)), d.get("block_size"), d.get("last_ts"),
                   tuple(CachedBlockView.from_dict(b) for b in d.get("blocks", ())),
                   tuple(StreamHole(**h) for h in d.get("holes", ())),
                   tuple(StreamSegment(**s) for s in d.get("segments", ())),
                   int(d.get("stored_blocks", 0)), int(d.get("removed_blocks", 0)),
                   int(d.get("unknown_removals", 0)), int(d.get("clears", 0)))


@dataclass(frozen=True, slots=True)
class HashCacheSnapshot:
    """Every pod's cached blocks after step ``step`` of an attached run."""

    KIND: ClassVar[str] = "hash_cache"
    step: int
    pods: dict[str, PodCacheView]  # in the order the pods first appeared

    @property
    def num_cached_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pods.values())

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.KIND, "step": self.step,
                "pods": {name: p.to_dict() for name, p in self.pods.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HashCacheSnapshot:
        if d.get("kind") != cls.KIND:
            raise ValueError(f"not a hash-cache snapshot (kind {d.get('kind')!r})")
        return cls(int(d["step"]), {str(name): PodCacheView.from_dict(str(name), p)
                                    for name, p in dict(d.get("pods") or {}).items()})

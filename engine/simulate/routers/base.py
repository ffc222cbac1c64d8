"""What every router shares: the request as a router sees it, the interface, tie-breaks."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from engine.simulate.pod import SimPod


@dataclass(frozen=True, slots=True)
class Routed:
    """An arriving request: its id, prompt tokens and the chained hashes of its full
    blocks that a lookup may use (never the block holding the last token), computed
    once with the pods' own hash (vLLM's sha256 by default, as llm-d and Dynamo rebuild)."""

    request_id: str
    token_ids: list[int]
    block_hashes: tuple[str, ...]


class Router:
    name: ClassVar[str]
    models: ClassVar[str]  # the real system it models, for the report

    def __init__(self, num_pods: int, block_size: int) -> None:
        self.num_pods = num_pods
        self.block_size = block_size

    def route(self, req: Routed, pods: list[SimPod]) -> int:
        raise NotImplementedError

    def observe(self, pod: int, stored: list[str], removed: list[str]) -> None:
        """The KV events pod ``pod`` published at the end of a step (routers that index
        events override it)."""

    def finished(self, pod: int, request_id: str) -> None:
        """A request routed to ``pod`` ended (its response stream closed)."""


def best(scores: list[float], pods: list[SimPod]) -> int:
    """The highest score; ties to the least loaded pod (running + waiting), then the first."""
    return max(range(len(pods)), key=lambda i: (scores[i], -pods[i].load, -i))


def consecutive(hashes: tuple[str, ...], held) -> int:
    """How many of ``hashes`` from the first are in ``held`` (a set or dict); in C."""
    return len(list(takewhile(held.__contains__, hashes)))

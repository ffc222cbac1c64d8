"""llm-d's precise prefix-cache scorer (``llm-d-kv-cache``'s indexer behind the
inference scheduler): each pod's score is the longest consecutive run of the request's
block hashes, from the first, that the pod's KV events say it holds; the highest score
wins, ties to the least loaded pod. The index lags the truth by what the events have
not said yet (a step in flight)."""

from __future__ import annotations

from engine.simulate.routers.base import Router, best, consecutive
from engine.simulate.routers.kv_index import KVIndex


class PrecisePrefix(Router):
    name = "precise-prefix"
    models = "llm-d precise prefix-cache scorer (longest cached prefix from KV events)"

    def __init__(self, num_pods: int, block_size: int) -> None:
        super().__init__(num_pods, block_size)
        self.index = KVIndex(num_pods)

    def observe(self, pod, stored, removed) -> None:
        self.index.observe(pod, stored, removed)

    def route(self, req, pods) -> int:
        return best([consecutive(req.block_hashes, held) for held in self.index.held], pods)

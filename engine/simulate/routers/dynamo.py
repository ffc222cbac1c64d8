"""NVIDIA Dynamo's KV router cost (``lib/llm/src/kv_router``): for each worker,
``overlap_weight × prefill blocks + decode blocks``, lowest wins (temperature 0: no
softmax sampling). Prefill blocks: the request's blocks minus its overlap with the
worker, the overlap from the worker's KV events (Dynamo's KvIndexer). Decode blocks:
the blocks of the requests the router has in flight on that worker (its own
ActiveSequences bookkeeping) plus this request's. Ties to the first worker."""

from __future__ import annotations

from engine.simulate.routers.base import Router, consecutive
from engine.simulate.routers.kv_index import KVIndex

OVERLAP_WEIGHT = 1.0


class DynamoCost(Router):
    name = "dynamo"
    models = "Dynamo KV router: overlap_weight x prefill blocks + decode blocks, lowest wins"

    def __init__(self, num_pods: int, block_size: int, overlap_weight: float = OVERLAP_WEIGHT) -> None:
        super().__init__(num_pods, block_size)
        self.overlap_weight = overlap_weight
        self.index = KVIndex(num_pods)
        self.active: list[int] = [0] * num_pods  # blocks in flight per worker
        self.blocks_of: dict[str, tuple[int, int]] = {}

    def observe(self, pod, stored, removed) -> None:
        self.index.observe(pod, stored, removed)

    def route(self, req, pods) -> int:
        bs = self.block_size
        blocks = -(-len(req.token_ids) // bs)
        costs = []
        for k in range(self.num_pods):
            overlap = consecutive(req.block_hashes, self.index.held[k])
            costs.append(self.overlap_weight * (blocks - overlap) + self.active[k] + blocks)
        k = min(range(self.num_pods), key=lambda i: (costs[i], i))
        self.active[k] += blocks
        self.blocks_of[req.request_id] = (k, blocks)
        return k

    def finished(self, pod, request_id) -> None:
        k, blocks = self.blocks_of.pop(request_id, (pod, 0))
        self.active[k] -= blocks

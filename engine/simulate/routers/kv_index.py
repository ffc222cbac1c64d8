"""A router's index of which pod holds which block hash, fed by the pods' KV events
(BlockStored / BlockRemoved), as llm-d's KV cache indexer and Dynamo's KvIndexer keep."""

from __future__ import annotations


class KVIndex:
    def __init__(self, num_pods: int) -> None:
        self.held: list[set[str]] = [set() for _ in range(num_pods)]

    def observe(self, pod: int, stored: list[str], removed: list[str]) -> None:
        held = self.held[pod]
        held.update(stored)
        held.difference_update(removed)

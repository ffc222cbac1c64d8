"""The Gateway API inference extension's approximate prefix-cache scorer (the
``prefix-cache-scorer`` plugin): no KV events. It hashes the prompt in chunks (chained,
at most ``MAX_CHUNKS``), keeps per pod an LRU of ``LRU_CAPACITY`` chunk hashes filled from
its own routing decisions, and scores a pod by the share of the request's chunks, from the
first, found in that pod's LRU; the highest wins, ties to the least loaded pod.

GIE hashes 64 characters of prompt text per chunk; the simulator has tokens, so a chunk
is ``CHUNK_TOKENS`` = 16 tokens (about 64 characters at 4 characters per token)."""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import repeat

from engine.simulate.routers.base import Router, best, consecutive

CHUNK_TOKENS = 16
MAX_CHUNKS = 256
LRU_CAPACITY = 31_250


def chunk_hashes(tokens: list[int], chunk: int = CHUNK_TOKENS, limit: int = MAX_CHUNKS) -> list[int]:
    out, h = [], 0
    for i in range(0, min(len(tokens) // chunk, limit) * chunk, chunk):
        h = hash((h, *tokens[i:i + chunk]))
        out.append(h)
    return out


class ApproxPrefix(Router):
    name = "approx-prefix"
    models = "Gateway API inference extension approximate prefix scorer (own LRU, no events)"

    def __init__(self, num_pods: int, block_size: int) -> None:
        super().__init__(num_pods, block_size)
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_pods)]

    def route(self, req, pods) -> int:
        chunks = chunk_hashes(req.token_ids)
        scores = [consecutive(chunks, lru) / len(chunks) if chunks else 0.0 for lru in self.lru]
        k = best(scores, pods)
        lru = self.lru[k]
        # each chunk to the most recent end in turn (a set and move_to_end each), in C: the
        # chunks out, then in again in the order of their last occurrence
        last = dict.fromkeys(reversed(chunks))
        deque(map(lru.pop, last, repeat(None)), maxlen=0)
        lru.update(zip(reversed(last), repeat(None)))
        for _ in range(len(lru) - LRU_CAPACITY):
            lru.popitem(last=False)
        return k

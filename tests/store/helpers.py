"""A tiny recorded run shared by the store tests."""

from engine.events.types import (
    BlockAllocated, BlockCached, BlockFreed, PrefixLookup, RequestArrived, RequestFinished,
    RequestProgress, RequestScheduled,
)
from engine.events.step import StepRecord

CONFIG = {"num_blocks": 4, "block_size": 4, "max_num_batched_tokens": 16, "max_model_len": 8}


def _admit(step, rid, blocks, n):
    return ([RequestArrived(step, rid, n, tuple(range(n))),
             PrefixLookup(step, rid, n, 0, n, 0, 0, 0)]
            + [BlockAllocated(step, b, rid, i) for i, b in enumerate(blocks)]
            + [RequestScheduled(step, rid, n, "prefill")])


def records():
    """Steps 1..3: a (2 blocks) runs and finishes, b (1 block) keeps running."""
    return [
        StepRecord(0, 1, 10.0, _admit(1, "a", [0, 1], 6)
                   + [RequestProgress(1, "a", 7, 6, (9,)),
                      BlockCached(1, 0, "h0", None, (0, 1, 2, 3))],
                   {"kv_cache_usage": 0.5}),
        StepRecord(1, 2, 10.5, _admit(2, "b", [2], 3)
                   + [RequestProgress(2, "b", 4, 3, (8,)),
                      RequestProgress(2, "a", 8, 7, (7,))],
                   {"kv_cache_usage": 0.75}),
        StepRecord(2, 3, 11.0, [BlockFreed(3, 1, "a", 0), BlockFreed(3, 0, "a", 0),
                                RequestFinished(3, "a", "length"),
                                RequestProgress(3, "b", 5, 4, (6,))],
                   {"kv_cache_usage": 0.25}),
    ]

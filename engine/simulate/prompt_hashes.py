"""The chained block hashes of each arriving prompt, computed once (the router scores with
them and the pod's lookup takes them, ``KVCacheManager.give_block_hashes``).

A Mooncake record's prompt is made block by block from its hash ids (``trace.mooncake_tokens``):
the tokens of 512-token block ``j`` depend on ``hash_ids[j]`` alone, so the chained hashes
of its sub-blocks depend only on the hash before the block and on ``hash_ids[j]``. Those
are remembered (the most recent ``max_entries`` blocks), and a conversation turn that
re-sends its history, or a shared system prompt, is not hashed again: the same hashes,
not re-computed ones (tests/simulate/test_traces.py checks them against the core's).
"""

from __future__ import annotations

from collections import OrderedDict

from engine.core.hashing import BlockHasher
from engine.simulate.trace import MOONCAKE_BLOCK, TracedRequest


class PromptHashes:
    def __init__(self, hasher: BlockHasher, block_size: int, max_entries: int = 1 << 15) -> None:
        self.hasher = hasher
        self.block_size = block_size
        self.max_entries = max_entries
        # (hash before, id) -> hashes, oldest first (an OrderedDict: a dict's first key, after
        # many deletions at its front, is found by scanning past their dummies)
        self._blocks: OrderedDict[tuple[str | None, int], list[str]] = OrderedDict()
        self.num_reused = 0  # block hashes taken from the memory rather than hashed

    def __call__(self, tr: TracedRequest, tokens: list[int]) -> tuple[str, ...]:
        """The hashes of the prompt's full blocks that a lookup may hit (never the block
        holding the last token)."""
        bs = self.block_size
        limit = (len(tokens) - 1) // bs
        if tr.hash_ids is None or MOONCAKE_BLOCK % bs:
            return tuple(self.hasher.full_blocks(tokens, bs, [], num_blocks=limit))
        per, full = MOONCAKE_BLOCK // bs, len(tokens) // bs
        made = tr.prompt_token_ids is None  # by trace.mooncake_tokens: Python ints
        memo, out = self._blocks, []
        for hid in tr.hash_ids:
            if len(out) >= limit:
                break
            key = (out[-1] if out else None, hid)
            got = memo.get(key)
            if got is not None:
                out.extend(got)
                self.num_reused += len(got)
                continue
            start = len(out)
            self.hasher.full_blocks(tokens, bs, out, num_blocks=min(start + per, full), all_int=made)
            if len(out) - start == per:  # a whole block (a prompt's cut last one is not kept)
                if len(memo) >= self.max_entries:
                    memo.popitem(last=False)  # the oldest first
                memo[key] = out[start:]
        return tuple(out[:limit])

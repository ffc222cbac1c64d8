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

MAX_ENTRIES = 1 << 15  # Mooncake blocks remembered (32,768: 1M hashes of 16 tokens)


class PromptHashes:
    def __init__(self, hasher: BlockHasher, block_size: int, max_entries: int = MAX_ENTRIES) -> None:
        self.hasher = hasher
        self.block_size = block_size
        self.max_entries = max_entries
        # (hash before, id) -> (its number, its hashes), oldest first (an OrderedDict: a dict's
        # first key, after many deletions at its front, is found by scanning past their dummies)
        self._blocks: OrderedDict[tuple[str | None, int], tuple[int, list[str]]] = OrderedDict()
        self._numbered = 0  # blocks remembered so far: the next one's number
        self.num_reused = 0  # block hashes taken from the memory rather than hashed

    def __call__(self, tr: TracedRequest, tokens: list[int], parts: list | None = None) -> tuple[str, ...]:
        """The hashes of the prompt's full blocks that a lookup may hit (never the block
        holding the last token). ``parts``, when given, gets them as ``SharedBlocks.join``
        takes them: per Mooncake block, the number of one remembered, or the hashes made."""
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
                out.extend(got[1])
                self.num_reused += per
                if parts is not None:
                    parts.append(got[0])
                continue
            start = len(out)
            self.hasher.full_blocks(tokens, bs, out, num_blocks=min(start + per, full), all_int=made)
            block = out[start:]
            if parts is not None:
                parts.append(block)
            if len(block) == per:  # a whole block (a prompt's cut last one is not kept)
                if len(memo) >= self.max_entries:
                    memo.popitem(last=False)  # the oldest first
                memo[key] = (self._numbered, block)
                self._numbered += 1
        return tuple(out[:limit])


class SharedBlocks:
    """The receiving side of ``PromptHashes(parts=)`` (``engine.simulate.prompt_feed``): the
    same blocks remembered under the same numbers, forgotten in the same order, so a
    prompt's remembered blocks are the same string objects as another's, as when the run
    hashes its prompts itself (a fleet's queued prompts share them: less memory)."""

    def __init__(self, block_size: int, max_entries: int = MAX_ENTRIES) -> None:
        self.per = MOONCAKE_BLOCK // block_size  # parts come only when it divides 512
        self.max_entries = max_entries
        self._blocks: dict[int, list[str]] = {}
        self._numbered = 0

    def join(self, parts: list, limit: int) -> tuple[str, ...]:
        out: list[str] = []
        blocks = self._blocks
        for part in parts:
            if isinstance(part, int):
                out.extend(blocks[part])
                continue
            out.extend(part)
            if len(part) == self.per:  # remembered by the maker too
                blocks[self._numbered] = part
                blocks.pop(self._numbered - self.max_entries, None)
                self._numbered += 1
        return tuple(out[:limit])

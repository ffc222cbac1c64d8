"""MissCauses: why a prefix-cache lookup missed, with bounded memory.

A lookup hits the longest run of cached full blocks. Each prompt token past the
hit is a miss with one cause (``prefix_lookup`` event, tokens):
- ``partial``: the block holds the last prompt token (always recomputed: its
  logits are needed), is unfinished (never hashed), or is the first missing block
  and a cached block with the same parent starts like it (the shared prefix ended
  inside the block; vLLM #54607);
- ``evicted``: the block's hash was cached once and is not any more (or it is
  cached but an earlier block of the chain is gone);
- ``cold``: never cached, as far as this book remembers.

Telling evicted from cold needs the hashes that were dropped. A long-running
server drops hashes forever, so the book remembers only the most recently dropped
``max_remembered`` (an LRU keyed by drop time; a hash cached again leaves it).
Default bound: 4 pool-fulls of blocks, at least 4,096 and at most 262,144 hashes
(about 200 bytes each, measured: a 64-char hex string and its ordered-dict entry,
so ~54 MB at most). Past the bound the oldest-dropped hash is forgotten, and a later miss
on it reads ``cold``: after more than ``max_remembered`` drops, ``evicted`` is a
lower bound and ``cold`` an upper bound. Misses stay exact in total.

Writer: the BlockPool's cache hooks (``cached``/``uncached``, a run of blocks at a time),
which the KVCacheManager wires up; ``classify`` only reads.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.block_pool import Block

MIN_REMEMBERED, MAX_REMEMBERED = 4096, 1 << 18


def default_max_remembered(num_blocks: int) -> int:
    """4 pool-fulls of dropped hashes, clamped to [4,096, 262,144] (module docstring)."""
    return min(max(4 * num_blocks, MIN_REMEMBERED), MAX_REMEMBERED)


class MissCauses:
    """Remembers dropped hashes (bounded) and cached blocks by parent; splits misses."""

    def __init__(self, block_size: int, max_remembered: int) -> None:
        if max_remembered < 1:
            raise ValueError(f"max_remembered must be >= 1, got {max_remembered}")
        self.block_size = block_size
        self.max_remembered = max_remembered
        self._dropped: OrderedDict[str, None] = OrderedDict()  # oldest drop first
        # parent hash → the cached block under it, or a set when there are several (most
        # parents have one child: no set made for it), to see misses that diverge
        # mid-block; bounded by the pool (only cached blocks are in it)
        self._children: dict[str | None, Block | set[Block]] = {}

    # ---- hooks (the pool calls these as hashes come and go) -------------------

    def on_cached(self, block: Block) -> None:
        self.cached((block,))

    def on_uncached(self, block: Block) -> None:
        self.uncached((block,))

    def cached(self, blocks: Sequence[Block]) -> None:
        """These blocks just got their hashes (the pool's ``on_cached`` hook: a run at once)."""
        children = self._children
        deque(map(self._dropped.pop, [b.hash for b in blocks], repeat(None)), maxlen=0)  # in C
        for block in blocks:
            parent = block.parent_hash
            siblings = children.get(parent)
            if siblings is None:
                children[parent] = block
            elif type(siblings) is set:
                siblings.add(block)
            elif siblings is not block:
                children[parent] = {siblings, block}

    def uncached(self, blocks: Sequence[Block]) -> None:
        """These blocks are losing their hashes, in this order (the pool's ``on_uncached``
        hook, while they still hold them). The oldest drops past the bound are forgotten
        once at the end: the same book as one drop at a time, since each keeps the most
        recently dropped ``max_remembered``."""
        children, dropped = self._children, self._dropped
        for block in blocks:
            parent = block.parent_hash
            siblings = children.get(parent)
            if siblings is block:
                del children[parent]
            elif type(siblings) is set:
                siblings.discard(block)
                if not siblings:
                    del children[parent]
        # each hash now the most recent drop, in order (one dropped again moves to the
        # end): out of the book, then in at its end, both in C (a cached hash is held by
        # one block, so the run has no repeats)
        hashes = [b.hash for b in blocks]
        deque(map(dropped.pop, hashes, repeat(None)), maxlen=0)
        dropped.update(dict.fromkeys(hashes))
        for _ in range(len(dropped) - self.max_remembered):
            dropped.popitem(last=False)

    @property
    def num_remembered(self) -> int:
        return len(self._dropped)

    # ---- reading ----------------------------------------------------------------

    def was_cached(self, block_hash: str, cached: Mapping[str, Block]) -> bool:
        """Cached now, or dropped recently enough to be remembered."""
        return block_hash in cached or block_hash in self._dropped

    def classify(self, token_ids: Sequence[int], hashes: Sequence[str], num_hit_blocks: int,
                 cached: Mapping[str, Block]) -> tuple[int, int, int]:
        """(cold, evicted, partial) miss tokens of a lookup over ``token_ids`` whose
        full blocks hash to ``hashes`` and whose first ``num_hit_blocks`` hit."""
        bs, n = self.block_size, len(token_ids)
        max_blocks = (n - 1) // bs  # a hit never covers the last token
        cold = evicted = partial = 0
        first, end = num_hit_blocks, min(n // bs, max_blocks)
        if first < end:  # the first missing block: evicted, diverged mid-block or cold
            if self.was_cached(hashes[first], cached):
                evicted += bs
            elif self._diverges_mid_block(token_ids, first, hashes):
                partial += bs  # shared prefix ended inside this block
            else:
                cold += bs
            # the rest: evicted if cached or remembered (a hash is never in both: caching
            # it again takes it out of the book), else cold
            rest = hashes[first + 1:end]
            was = sum(map(cached.__contains__, rest)) + sum(map(self._dropped.__contains__, rest))
            evicted += bs * was
            cold += bs * (len(rest) - was)
        # cached or not, a block holding the last token is recomputed; an unfinished
        # block is never hashed
        partial += bs * max(0, n // bs - max(num_hit_blocks, max_blocks)) + n % bs
        return cold, evicted, partial

    def _diverges_mid_block(self, token_ids: Sequence[int], i: int, hashes: Sequence[str]) -> bool:
        """True when a cached block with the same parent shares this block's start."""
        siblings = self._children.get(hashes[i - 1] if i else None)
        if siblings is None:
            return False
        first = token_ids[i * self.block_size]
        if type(siblings) is not set:
            return siblings.token_ids[0] == first
        return any(b.token_ids[0] == first for b in siblings)

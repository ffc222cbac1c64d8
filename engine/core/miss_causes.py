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

Writer: the BlockPool's cache hooks (``on_cached``/``on_uncached``), which the
KVCacheManager wires up; ``classify`` only reads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
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
        # parent hash → cached blocks under it, to see misses that diverge mid-block;
        # bounded by the pool (only cached blocks are in it)
        self._children: dict[str | None, set[Block]] = {}

    # ---- hooks (the pool calls these as hashes come and go) -------------------

    def on_cached(self, block: Block) -> None:
        self._dropped.pop(block.hash, None)
        self._children.setdefault(block.parent_hash, set()).add(block)

    def on_uncached(self, block: Block) -> None:
        siblings = self._children.get(block.parent_hash)
        if siblings is not None:
            siblings.discard(block)
            if not siblings:
                del self._children[block.parent_hash]
        self._dropped[block.hash] = None
        self._dropped.move_to_end(block.hash)
        if len(self._dropped) > self.max_remembered:
            self._dropped.popitem(last=False)

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
        for i in range(num_hit_blocks, n // bs):
            if i >= max_blocks:
                partial += bs  # cached or not, this block holds the last token
            elif self.was_cached(hashes[i], cached):
                evicted += bs
            elif i == num_hit_blocks and self._diverges_mid_block(token_ids, i, hashes):
                partial += bs  # shared prefix ended inside this block
            else:
                cold += bs
        partial += n % bs  # an unfinished block is never hashed
        return cold, evicted, partial

    def _diverges_mid_block(self, token_ids: Sequence[int], i: int, hashes: Sequence[str]) -> bool:
        """True when a cached block with the same parent shares this block's start."""
        siblings = self._children.get(hashes[i - 1] if i else None)
        if not siblings:
            return False
        first = token_ids[i * self.block_size]
        return any(b.token_ids[0] == first for b in siblings)

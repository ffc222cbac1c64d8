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
Default bound: 4 pool-fulls of blocks, at least 4,096 and at most 262,144 hashes.
Measured (tracemalloc, 262,144 remembered, a pool of 65,536): ~70-77 MB, ~280 bytes a
remembered hash (its 64-char hex string, dict entry and drop number, and the list of
drops, which keeps up to half a bound of forgotten ones until it is trimmed). Past the bound the oldest-dropped hash
is forgotten, and a later miss on it reads ``cold``: after more than ``max_remembered`` drops, ``evicted`` is a
lower bound and ``cold`` an upper bound. Misses stay exact in total.

Writer: the BlockPool's cache hooks (``cached``/``uncached``, a run of blocks at a time,
each in a few bulk operations in C; a step of Python only for a parent with several
cached children), which the KVCacheManager wires up; ``classify`` only reads.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import accumulate, compress, count, repeat
from operator import attrgetter, eq, is_, not_
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.block_pool import Block

MIN_REMEMBERED, MAX_REMEMBERED = 4096, 1 << 18

_hash, _parent = attrgetter("hash"), attrgetter("parent_hash")


def default_max_remembered(num_blocks: int) -> int:
    """4 pool-fulls of dropped hashes, clamped to [4,096, 262,144] (module docstring)."""
    return min(max(4 * num_blocks, MIN_REMEMBERED), MAX_REMEMBERED)


class MissCauses:
    """Remembers dropped hashes (bounded) and cached blocks by parent; splits misses.

    Every change is a few bulk operations in C over a run of blocks:

    - ``_book``: each remembered dropped hash -> the number of its latest drop (drops are
      numbered 0, 1, ... in order). Forgetting the oldest past the bound walks ``_drops``
      (the hash of each drop number from ``_base``) from the last one forgotten: a drop
      is in the book while ``_book`` holds its number for its hash (not when the hash was
      cached or dropped again since).
    - ``_children``: parent hash -> the cached block under it (a set for several), for
      a miss that diverged mid-block; a run's blocks are added or removed in C, and only
      a parent with several children takes a step of Python.
    """

    def __init__(self, block_size: int, max_remembered: int) -> None:
        if max_remembered < 1:
            raise ValueError(f"max_remembered must be >= 1, got {max_remembered}")
        self.block_size = block_size
        self.max_remembered = max_remembered
        self._book: dict[str, int] = {}
        self._drops: list[str] = []  # the hash of drop number _base + i
        self._base = 0
        self._next = 0  # where forgetting resumes, in _drops
        # parent hash -> the cached block under it, or a set when there are several (most
        # parents have one child: no set made for it); bounded by the pool
        self._children: dict[str | None, Block | set[Block]] = {}
        # stale drops a compaction lets pass: its cost is spread over at least this many
        self.slack = max(max_remembered // 2, MIN_REMEMBERED)

    # ---- hooks (the pool calls these as hashes come and go) -------------------

    def on_cached(self, block: Block) -> None:
        self.cached((block,))

    def on_uncached(self, block: Block) -> None:
        self.uncached((block,))

    def cached(self, blocks: Sequence[Block]) -> None:
        """These blocks just got their hashes (the pool's ``on_cached`` hook: a run at once)."""
        deque(map(self._book.pop, map(_hash, blocks), repeat(None)), maxlen=0)  # remembered ones leave
        children = self._children
        parents = list(map(_parent, blocks))  # a chain's: no two alike
        known = list(map(children.__contains__, parents))
        if True not in known:  # nearly always: each parent's first cached child
            children.update(zip(parents, blocks))
            return
        children.update(zip(compress(parents, map(not_, known)), compress(blocks, map(not_, known))))
        for parent, block in zip(compress(parents, known), compress(blocks, known)):
            siblings = children[parent]
            if type(siblings) is set:
                siblings.add(block)
            elif siblings is not block:
                children[parent] = {siblings, block}

    def uncached(self, blocks: Sequence[Block]) -> None:
        """These blocks are losing their hashes, in this order (the pool's ``on_uncached``
        hook, while they still hold them: each was cached with ``cached`` and has not
        lost its hash since). The oldest drops past the bound are forgotten once at the
        end: the same book as one drop at a time, since each keeps the most recently
        dropped ``max_remembered``."""
        children = self._children
        parents = list(map(_parent, blocks))
        only = list(map(is_, map(children.get, parents), blocks))
        deque(map(children.__delitem__, compress(parents, only)), maxlen=0)  # each its parent's one child
        if False in only:  # one of several children (siblings may go in one run)
            for parent, block in zip(compress(parents, map(not_, only)), compress(blocks, map(not_, only))):
                siblings = children[parent]
                if siblings is block:
                    del children[parent]
                else:
                    siblings.discard(block)
                    if len(siblings) == 1:
                        children[parent] = siblings.pop()
        hashes = list(map(_hash, blocks))  # each cached until now: none in the book yet
        book, drops = self._book, self._drops
        book.update(zip(hashes, count(self._base + len(drops))))
        drops.extend(hashes)
        if len(book) > self.max_remembered:
            self._forget(len(book) - self.max_remembered)
        if len(drops) - self._next > self.max_remembered + self.slack:
            self._compact()

    def _forget(self, n: int) -> None:
        """Forget the ``n`` oldest-dropped hashes of the book."""
        book, drops, base, i = self._book, self._drops, self._base, self._next
        while n:
            seg = drops[i:i + n]
            assert seg, "the book holds more hashes than its drops"
            live = list(map(eq, map(book.get, seg), range(base + i, base + i + len(seg))))
            k = live.count(True)
            if k > n:  # the n-th entry here is the last one forgotten
                k = n
                del seg[bisect_left(list(accumulate(live)), n) + 1:]
            deque(map(book.pop, compress(seg, live)), maxlen=0)
            n -= k
            i += len(seg)
        self._next = i
        if i > self.slack:  # the forgotten drops (and their strings) are never read again
            del drops[:i]
            self._base, self._next = base + i, 0

    def _compact(self) -> None:
        """Only the book's drops in ``_drops``, renumbered in order (bounded memory where
        hashes come back to the cache more often than the book is full)."""
        book, seg = self._book, self._drops[self._next:]
        start = self._base + self._next
        kept = list(compress(seg, map(eq, map(book.get, seg), range(start, start + len(seg)))))
        book.update(zip(kept, count(start)))
        self._drops, self._base, self._next = kept, start, 0

    @property
    def num_remembered(self) -> int:
        return len(self._book)

    # ---- reading ----------------------------------------------------------------

    def was_cached(self, block_hash: str, cached: Mapping[str, Block]) -> bool:
        """Cached now, or dropped recently enough to be remembered."""
        return block_hash in cached or block_hash in self._book

    def classify(self, token_ids: Sequence[int], hashes: Sequence[str], num_hit_blocks: int,
                 cached: Mapping[str, Block]) -> tuple[int, int, int]:
        """(cold, evicted, partial) miss tokens of a lookup over ``token_ids`` whose
        full blocks hash to ``hashes`` and whose first ``num_hit_blocks`` hit (``cached``:
        the pool's hash -> block map)."""
        bs, n = self.block_size, len(token_ids)
        max_blocks = (n - 1) // bs  # a hit never covers the last token
        cold = evicted = partial = 0
        first, end = num_hit_blocks, min(n // bs, max_blocks)
        if first < end:
            # each missing block is evicted if cached or remembered, else cold; but the
            # first may also have diverged mid-block from a cached one (partial)
            # (a hash is never in both: caching it again takes it out of the book)
            missed = hashes[first:end]
            was = sum(map(cached.__contains__, missed)) + sum(map(self._book.__contains__, missed))
            evicted += bs * was
            cold += bs * (end - first - was)
            if not self.was_cached(hashes[first], cached) and self._diverges_mid_block(token_ids, first, hashes):
                cold -= bs
                partial += bs  # shared prefix ended inside this block
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

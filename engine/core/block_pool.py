"""The physical block pool: ref counts, the free queue and the hash → block map.

Writer: only the KVCacheManager calls the mutating methods; every change is
recorded as a protocol event in the shared EventLog (built only when the log keeps
events; the counts are kept either way). Whoever needs to follow hashes as they come
and go (the miss-cause book) passes ``on_cached`` / ``on_uncached``; the pool keeps no
bookkeeping of its own for them. A simulated pod reads vLLM's KV event feed off
``stored`` / ``removed`` (lists of hashes, None unless someone set them).

Free-queue policy (as vLLM's): blocks are reused from the head. A block whose
ref count drops to 0 goes to the head if it has no hash (nothing worth keeping)
and to the tail if it is cached, so cached blocks are evicted least recently
used first. Freeing walks a table backwards, so a request's tail blocks reach
the eviction end before its head blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.core.event_log import EventLog
from engine.events.schema.types import BlockCached, BlockEvicted, BlockFreed, EvictionReason

BlockHook = Callable[[Sequence["Block"]], None]  # a run of blocks, in the pool's order


class Block:
    """One physical block of ``block_size`` token slots (in every layer)."""

    __slots__ = ("id", "ref_count", "hash", "parent_hash", "token_ids", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref_count = 0
        self.hash: str | None = None
        self.parent_hash: str | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.id}, ref={self.ref_count}, hash={(self.hash or '-')[:8]})"


_UNWATCHED: frozenset = frozenset()  # BlockPool.watched when no lookup is remembered


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) push at either end, pop, and remove."""

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)  # sentinels
        self._tail = Block(-2)
        self._len = 0
        prev = self._head
        for b in blocks:  # append each, linked here (a pool's blocks are up to millions)
            assert b.prev is None and b.next is None, f"{b} is already in the free queue"
            b.prev = prev
            prev.next = prev = b
        prev.next, self._tail.prev = self._tail, prev
        self._len = len(blocks)

    def __len__(self) -> int:
        return self._len

    def _link(self, b: Block, before: Block) -> None:
        assert b.prev is None and b.next is None, f"{b} is already in the free queue"
        b.prev, b.next = before.prev, before
        before.prev.next = b
        before.prev = b
        self._len += 1

    def append(self, b: Block) -> None:
        self._link(b, self._tail)

    def appendleft(self, b: Block) -> None:
        self._link(b, self._head.next)

    def remove(self, b: Block) -> None:
        assert b.prev is not None and b.next is not None, f"{b} is not in the free queue"
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self._len -= 1

    def popleft(self) -> Block:
        if self._len == 0:
            raise IndexError("no free block")
        b = self._head.next
        self.remove(b)
        return b

    def __contains__(self, b: Block) -> bool:
        return b.prev is not None

    def ids(self) -> list[int]:
        out, b = [], self._head.next
        while b is not self._tail:
            out.append(b.id)
            b = b.next
        return out


class BlockPool:
    """``num_blocks`` blocks, all free at start, in id order."""

    def __init__(self, num_blocks: int, log: EventLog, on_cached: BlockHook | None = None,
                 on_uncached: BlockHook | None = None) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[str, Block] = {}
        self.log = log
        self.num_cached_free = 0  # ref_count 0 with a hash: hittable, evicted LRU
        self._on_cached = on_cached  # called after blocks got their hashes
        self._on_uncached = on_uncached  # called while the blocks still hold them
        self.stored: list[str] | None = None  # hashes cached, in order, when a list is set
        self.removed: list[str] | None = None  # hashes dropped, in order, when a list is set
        # blocks a remembered lookup relies on (``KVCacheManager``'s failed admission): a
        # change to any of them that could change that lookup (its hash dropped, its ref
        # count to or from 0) replaces the set, so the manager knows its memory is stale
        self.watched: set[Block] = _UNWATCHED
        # a cached block keeps its tokens and its parent's hash (snapshots, events and the
        # miss-cause book read them); off where none of those is (a simulated pod without
        # events or book: 16-tuples for millions of blocks, made only to be dropped)
        self.keep_tokens = True

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self) -> Block:
        """Pop the head of the free queue (evicting its hash if cached); ref becomes 1."""
        b = self.free_queue.popleft()
        assert b.ref_count == 0
        if b.hash is not None:
            self.uncache(b, EvictionReason.REUSE)
        b.ref_count = 1
        return b

    def take_many(self, n: int) -> list[Block]:
        """``take()`` ``n`` times (the same blocks, evictions and order), with the queue
        unlinked once; for a caller that logs no event between the takes."""
        q = self.free_queue
        if n > q._len:
            raise IndexError("no free block")
        if self.log.enabled:
            return [self.take() for _ in range(n)]
        # a free block has no reference: an evicted one leaves num_cached_free
        out: list[Block] = []
        evicted: list[Block] = []
        head = q._head
        b = head.next
        for _ in range(n):
            nxt = b.next
            b.prev = b.next = None
            if b.hash is not None:
                evicted.append(b)
            b.ref_count = 1
            out.append(b)
            b = nxt
        head.next, b.prev = b, head
        q._len -= n
        if evicted:  # uncache(b, REUSE) for each, in order, the hooks called once
            if self.watched and not self.watched.isdisjoint(evicted):
                self.watched = _UNWATCHED
            hashes = [b.hash for b in evicted]
            list(map(self.cached.pop, hashes))  # del cached[h] each, in C
            if self._on_uncached is not None:
                self._on_uncached(evicted)
            if self.removed is not None:
                self.removed.extend(hashes)
            for b in evicted:
                b.hash = b.parent_hash = b.token_ids = None
            self.num_cached_free -= len(evicted)
            self.log.counts.count_evicted(EvictionReason.REUSE, len(evicted))
        return out

    def touch(self, b: Block) -> None:
        """Add a reference to an existing block (prefix hit or fork)."""
        if b.ref_count == 0:
            self.free_queue.remove(b)
            self.num_cached_free -= b.hash is not None
            if b in self.watched:
                self.watched = _UNWATCHED
        b.ref_count += 1

    def release(self, b: Block, request_id: str) -> None:
        """Drop one reference; at zero the block joins the free queue."""
        assert b.ref_count > 0, f"releasing {b} with no references"
        b.ref_count -= 1
        if self.log.enabled:
            self.log.add(BlockFreed(self.log.step, b.id, request_id, b.ref_count))
        if b.ref_count == 0:
            if b.hash is None:
                self.free_queue.appendleft(b)
            else:
                self.free_queue.append(b)
                self.num_cached_free += 1
                if b in self.watched:
                    self.watched = _UNWATCHED

    def release_all(self, blocks: list[Block], request_id: str) -> None:
        """``release`` each of ``blocks`` in order (a table, tail first)."""
        if self.log.enabled:
            for b in blocks:
                self.release(b, request_id)
            return
        q = self.free_queue
        head, tail = q._head, q._tail
        for b in blocks:
            assert b.ref_count > 0, f"releasing {b} with no references"
            b.ref_count -= 1
            if b.ref_count == 0:
                if b.hash is None:  # to the head: reused first
                    after = head.next
                    b.prev, b.next = head, after
                    head.next = after.prev = b
                else:  # to the tail: evicted least recently used first
                    before = tail.prev
                    b.prev, b.next = before, tail
                    before.next = tail.prev = b
                    self.num_cached_free += 1
                q._len += 1
        if self.watched and not self.watched.isdisjoint(blocks):  # (a count still above 0 too)
            self.watched = _UNWATCHED

    def move_reference(self, b: Block) -> None:
        """A copy-on-write moved one reference from shared ``b`` to a fresh copy. ``b``
        stays referenced (its count was > 1), so it never joins the free queue here;
        the caller's ``cow_copy`` event records the move (no ``block_freed``)."""
        assert b.ref_count > 1, f"copy-on-write from unshared {b}"
        b.ref_count -= 1

    def cache(self, b: Block, block_hash: str, parent_hash: str | None,
              token_ids: tuple[int, ...]) -> bool:
        """Make a full block hittable; False if another block already holds this hash."""
        if b.hash is not None or block_hash in self.cached:
            return False
        b.hash, b.parent_hash, b.token_ids = block_hash, parent_hash, token_ids
        self.cached[block_hash] = b
        self.num_cached_free += b.ref_count == 0
        if self.log.enabled:
            self.log.add(BlockCached(self.log.step, b.id, block_hash, parent_hash, token_ids))
        if self._on_cached is not None:
            self._on_cached((b,))
        if self.stored is not None:
            self.stored.append(block_hash)
        return True

    def cache_run(self, table: list[Block], hashes: list[str], start: int, end: int,
                  token_ids: list[int], block_size: int) -> list[Block]:
        """``cache`` blocks ``table[start:end]``: block i with ``hashes[i]`` (its parent
        ``hashes[i - 1]``) and its tokens. Returns the blocks that got their hash."""
        out: list[Block] = []
        if self.log.enabled:
            parent = hashes[start - 1] if start else None
            for i in range(start, end):
                b, h = table[i], hashes[i]
                if self.cache(b, h, parent, tuple(token_ids[i * block_size:(i + 1) * block_size])):
                    out.append(b)
                parent = h
            return out
        cached = self.cached
        newly_free = 0
        keep = self.keep_tokens
        add = cached.setdefault  # one probe: a hash another block holds stays with it
        for i in range(start, end):
            b, h = table[i], hashes[i]
            if b.hash is None and add(h, b) is b:  # cache(b, h, ...), inline; hooks below
                b.hash = h
                if keep:
                    b.parent_hash = hashes[i - 1] if i else None
                    b.token_ids = tuple(token_ids[i * block_size:(i + 1) * block_size])
                newly_free += b.ref_count == 0
                out.append(b)
        self.num_cached_free += newly_free
        if out:
            if self._on_cached is not None:
                self._on_cached(out)
            if self.stored is not None:
                self.stored.extend([b.hash for b in out])
        return out

    def uncache(self, b: Block, reason: EvictionReason) -> None:
        """Drop a block's hash (``reason``: reuse, reset or rollback); it keeps its place."""
        assert b.hash is not None
        del self.cached[b.hash]
        if b in self.watched:
            self.watched = _UNWATCHED
        self.num_cached_free -= b.ref_count == 0
        if self._on_uncached is not None:
            self._on_uncached((b,))
        if self.removed is not None:
            self.removed.append(b.hash)
        log = self.log
        if log.enabled:
            log.add(BlockEvicted(log.step, b.id, b.hash, reason))
        else:
            log.counts.count_evicted(reason)
        b.hash = b.parent_hash = b.token_ids = None

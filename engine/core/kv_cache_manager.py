"""KVCacheManager: block tables, prefix caching and copy-on-write.

Writer of every block table. It never touches tensors: copy-on-write pairs are
recorded for the runner, which copies the K/V before the step's forward. Why a
lookup missed is the miss-cause book's business (``engine.core.miss_causes``);
counting lookups, hits and evictions is the EventLog's (``EventCounts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import islice, takewhile
from operator import attrgetter, is_not

from engine.core.block_pool import _UNWATCHED, Block, BlockPool
from engine.core.config import CacheConfig
from engine.core.event_log import EventLog
from engine.core.hashing import get_hasher
from engine.core.miss_causes import MissCauses, default_max_remembered
from engine.core.request import Request
from engine.events.schema.types import (
    BlockAllocated, CowCopy, EvictionReason, PrefixCacheReset, PrefixHit, PrefixLookup,
    RequestForked,
)

_is_block = partial(is_not, None)  # a pool map hit (takewhile's test, in C)
_ref_count = attrgetter("ref_count")


@dataclass(slots=True)
class PrefixMatch:
    """Result of a side-effect-free prefix lookup; misses in tokens, by cause.

    ``resumed``: the request was preempted before (its lookup is counted apart).
    ``classified``: the miss causes are filled in; a lookup for admission leaves them to
    ``allocate_slots``, which fills them only when the admission goes ahead (before it
    changes anything), so a head of line that does not fit costs no classification."""

    blocks: list[Block] = field(default_factory=list)
    num_tokens: int = 0
    num_query_tokens: int = 0
    miss_cold: int = 0
    miss_evicted: int = 0
    miss_partial: int = 0
    miss_disabled: int = 0
    resumed: bool = False
    classified: bool = True
    hashes: list[str] | None = None  # the lookup's block hashes, while not classified
    num_free_hits: int = -1  # hit blocks no request holds (they take free blocks); -1: not counted yet


class KVCacheManager:
    def __init__(self, config: CacheConfig, log: EventLog,
                 max_remembered_hashes: int | None = None) -> None:
        """``max_remembered_hashes`` bounds the miss-cause book (default: see
        ``miss_causes.default_max_remembered``)."""
        self.config = config
        self.block_size = config.block_size
        self.hasher = get_hasher(config.prefix_caching_hash_algo)
        self.log = log
        self.misses = MissCauses(config.block_size, max_remembered_hashes
                                 or default_max_remembered(config.num_blocks))
        self.pool = BlockPool(config.num_blocks, log, on_cached=self.misses.cached,
                              on_uncached=self.misses.uncached)
        self.tables: dict[str, list[Block]] = {}
        self.hashes: dict[str, list[str]] = {}  # chained hashes of a request's full blocks
        self.num_hashed: dict[str, int] = {}  # how many table blocks went through cache()
        self.cow_pairs: list[tuple[int, int]] = []
        self._ids: dict[str, list[int]] = {}  # block_ids' lists, dropped when a table changes
        self.cached_this_step: list[Block] = []  # hashed at schedule, K/V not yet computed
        # the last admission that did not fit, its match still true while the pool's
        # ``watched`` is its blocks (``lookup`` then reads only what may have been added)
        self._unfit: tuple[Request, PrefixMatch, set[Block]] | None = None

    def give_block_hashes(self, request_id: str, hashes: list[str]) -> None:
        """The chained hashes of a new request's first full blocks, computed by a caller
        that needed them first (a router), so they are not computed again; vLLM's
        ``Request.block_hashes``. They must be this manager's hashes of its tokens."""
        self.hashes[request_id] = list(hashes)

    # ---- lookup -------------------------------------------------------------

    def lookup(self, req: Request, classify: bool = True) -> PrefixMatch:
        """Longest cached run of full blocks, never covering the last token. With
        ``classify=False`` the miss causes wait for ``allocate_slots`` (``PrefixMatch``)."""
        n, bs = req.num_tokens, self.block_size
        resumed = req.num_preemptions > 0  # as vLLM's PrefixCacheStats.record(preempted=)
        # vLLM reads no hit for a request that wants prompt logprobs (it needs every
        # prompt position's logits: ``skip_reading_prefix_cache``) and counts no query
        if not self.config.enable_prefix_caching or req.params.prompt_logprobs is not None:
            return PrefixMatch(num_query_tokens=n, miss_disabled=n, resumed=resumed)
        hashes = self.hasher.full_blocks(req.token_ids, bs, self.hashes.setdefault(req.request_id, []))
        max_blocks = (n - 1) // bs  # the last token's logits are needed
        cached = self.pool.cached
        unfit = self._remembered(req, n)
        if unfit is not None:
            # the head of line again, none of its hits changed since (a waiting request's
            # admission is retried every step; its hit run may be hundreds of blocks): only
            # blocks cached since can lengthen the run
            old = unfit[1]
            hit, free_hits = old.blocks, old.num_free_hits
            more = list(takewhile(_is_block, map(cached.get, islice(hashes, len(hit), max_blocks))))
            if more:
                hit = hit + more
                free_hits += list(map(_ref_count, more)).count(0)
                unfit[2].update(more)
            m = PrefixMatch(hit, len(hit) * bs, n, resumed=resumed, classified=False, hashes=hashes,
                            num_free_hits=free_hits)
        else:
            # the head run of hits, in C: map stops being read at the first miss
            hit = list(takewhile(_is_block, map(cached.get, islice(hashes, max_blocks))))
            m = PrefixMatch(hit, len(hit) * bs, n, resumed=resumed, classified=False, hashes=hashes)
        if classify:
            self._classify(req, m)
        return m

    def _remembered(self, req: Request, num_tokens: int) -> tuple[Request, PrefixMatch, set[Block]] | None:
        """The admission of ``req`` that did not fit, at this length, if none of its hit
        blocks changed since (the pool still watches the set made for it)."""
        u = self._unfit
        if u is not None and u[0] is req and u[2] is self.pool.watched and u[1].num_query_tokens == num_tokens:
            return u
        return None

    def _classify(self, req: Request, m: PrefixMatch) -> None:
        """Fill in ``m``'s miss causes (the pool as it was at the lookup: nothing between).
        Without the book (``drop_miss_causes``) every miss token reads ``cold``."""
        if self.misses is None:
            m.miss_cold = m.num_query_tokens - m.num_tokens
        else:
            m.miss_cold, m.miss_evicted, m.miss_partial = self.misses.classify(
                req.token_ids, m.hashes, len(m.blocks), self.pool.cached)
        m.classified, m.hashes = True, None

    def drop_miss_causes(self) -> None:
        """No miss-cause book from now on (before the first request): the pool's hooks
        are unset and every miss counts as ``cold``; hits, counts and every decision are
        unchanged. For callers that read no causes (``kvscope simulate`` unless asked, and
        its sweeps): the book's per-block bookkeeping is a quarter to a third of a
        fleet-scale trace's run (bench/RESULTS.md, Sessions 16-17)."""
        self.misses = None
        self.pool._on_cached = self.pool._on_uncached = None

    # ---- allocation ---------------------------------------------------------

    def blocks_needed(self, req: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> int:
        """Free blocks this allocation would take (new blocks + a copy-on-write + free hits)."""
        table = self.tables.get(req.request_id, [])
        computed = req.num_computed_tokens
        have = len(table)
        needed = 0
        if match is not None and match.blocks:
            computed, have = match.num_tokens, len(match.blocks)
            if match.num_free_hits < 0:
                match.num_free_hits = list(map(_ref_count, match.blocks)).count(0)  # in C
            needed += match.num_free_hits
        total = -(-(computed + num_new_tokens) // self.block_size)
        needed += max(0, total - have)
        if self._needs_cow(table, computed):
            needed += 1
        return needed

    def _needs_cow(self, table: list[Block], computed: int) -> bool:
        i = computed // self.block_size
        return i < len(table) and table[i].ref_count > 1

    def allocate_slots(self, req: Request, num_new_tokens: int, match: PrefixMatch | None = None) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``req``; False if the pool is short.

        With ``match`` (a new admission) the hit blocks become the table's head and
        the lookup is recorded. Nothing changes when this returns False.
        """
        if match is None:
            return self.extend_slots(req, num_new_tokens)
        pool = self.pool
        if self.blocks_needed(req, num_new_tokens, match) > pool.num_free:
            # remember it for the next lookup (see there): its hits watched from now on,
            # unless this match came from the memory and they are watched already
            unfit = self._remembered(req, match.num_query_tokens)
            watched = unfit[2] if unfit is not None else set(match.blocks)
            self._unfit, pool.watched = (req, match, watched), watched
            return False
        if self._unfit is not None:
            self._unfit, pool.watched = None, _UNWATCHED
        rid, step = req.request_id, self.log.step
        table = self.tables.setdefault(rid, [])
        before = len(table)
        assert not table, f"{rid} admitted with a non-empty table"
        if not match.classified:
            self._classify(req, match)
        self.log.add(PrefixLookup(step, rid, match.num_query_tokens, match.num_tokens,
                                  match.miss_cold, match.miss_evicted, match.miss_partial,
                                  match.miss_disabled, match.resumed))
        if match.blocks:
            for b in match.blocks:
                self.pool.touch(b)
            table.extend(match.blocks)
            self.num_hashed[rid] = len(match.blocks)
            if self.log.enabled:
                self.log.add(PrefixHit(step, rid, tuple(b.id for b in match.blocks), match.num_tokens))
        computed = match.num_tokens
        self._cow_if_shared(req, table, computed)
        self._grow(rid, table, -(-(computed + num_new_tokens) // self.block_size), before)
        # As vLLM: the blocks this step fills are hashed now, so a request admitted later
        # in the same step already hits them. Safe because one forward runs the whole
        # step and every layer writes all of the step's K/V before any token attends.
        self.cache_full_blocks(req, computed + num_new_tokens)
        return True

    def extend_slots(self, req: Request, num_new_tokens: int) -> bool:
        """``allocate_slots`` for a request already admitted (no match): the same checks
        and changes, read once (the path of every decode step)."""
        rid, bs = req.request_id, self.block_size
        table = self.tables.get(rid)
        computed = req.num_computed_tokens
        end = computed + num_new_tokens
        total = -(-end // bs)
        have = 0 if table is None else len(table)
        i = computed // bs
        cow = i < have and table[i].ref_count > 1
        if (total > have or cow) and max(0, total - have) + cow > self.pool.free_queue._len:
            return False  # (a decode step inside its last block needs no free block)
        if table is None:
            table = self.tables[rid] = []
        if cow:
            self._cow_if_shared(req, table, computed)
        if total > have:
            self._grow(rid, table, total, have)
        if end // bs > self.num_hashed.get(rid, 0) and self.config.enable_prefix_caching:
            self.cache_full_blocks(req, end)
        return True

    def _cow_if_shared(self, req: Request, table: list[Block], computed: int) -> None:
        """Before writing into a shared block at ``computed``, give the request its own copy."""
        if not self._needs_cow(table, computed):
            return
        rid = req.request_id
        i = computed // self.block_size
        src = table[i]
        dst = self.pool.take()
        table[i] = dst
        self._ids.pop(rid, None)
        self.pool.move_reference(src)
        self.cow_pairs.append((src.id, dst.id))
        self.log.add(CowCopy(self.log.step, rid, src.id, dst.id, i, src.ref_count))

    def _grow(self, rid: str, table: list[Block], total: int, before: int) -> None:
        """Append fresh blocks until the table has ``total`` (``before``: its length when
        the allocation began)."""
        if len(table) < total:
            log = self.log
            if log.enabled:
                step = log.step
                while len(table) < total:
                    b = self.pool.take()
                    table.append(b)
                    log.add(BlockAllocated(step, b.id, rid, len(table) - 1))
            else:
                table.extend(self.pool.take_many(total - len(table)))
        if len(table) != before:
            ids = self._ids.get(rid)
            if ids is not None and len(ids) == before:  # the old list plus the new ids
                self._ids[rid] = ids + [b.id for b in table[before:]]
            else:
                self._ids.pop(rid, None)

    def slot_mapping(self, req: Request, start: int, end: int) -> list[int]:
        """Physical slot of each token position in [start, end): a run of slots per block."""
        table, bs = self.tables[req.request_id], self.block_size
        if end - start == 1:  # a decode step
            return [table[start // bs].id * bs + start % bs]
        if end <= start:
            return []
        first, off = divmod(start, bs)
        last, last_off = divmod(end - 1, bs)
        base = table[first].id * bs
        if first == last:
            return list(range(base + off, base + last_off + 1))
        out = list(range(base + off, base + bs))
        extend = out.extend
        for b in table[first + 1:last]:
            base = b.id * bs
            extend(range(base, base + bs))
        base = table[last].id * bs
        extend(range(base, base + last_off + 1))
        return out

    def block_ids(self, request_id: str) -> list[int]:
        """The table's block ids: one list while the table is unchanged (a decode step does
        not rebuild a long context's), a new one when it changes. Read-only for callers."""
        ids = self._ids.get(request_id)
        if ids is None:
            ids = self._ids[request_id] = [b.id for b in self.tables.get(request_id, ())]
        return ids

    # ---- caching, forks, freeing -------------------------------------------

    def cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Hash the blocks full once the first ``num_tokens`` tokens are computed."""
        if not self.config.enable_prefix_caching:
            return
        rid, bs = req.request_id, self.block_size
        table = self.tables.get(rid, [])
        full = min(num_tokens // bs, len(table))
        start = self.num_hashed.get(rid, 0)
        if full <= start:
            return
        hashes = self.hashes.setdefault(rid, [])
        if len(hashes) < full:
            self.hasher.full_blocks(req.token_ids, bs, hashes, num_blocks=full)
        self.cached_this_step.extend(self.pool.cache_run(table, hashes, start, full, req.token_ids, bs))
        self.num_hashed[rid] = full

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares every block of the parent, the partial last one included."""
        table = self.tables[parent.request_id]
        for b in table:
            self.pool.touch(b)
        cid = child.request_id
        self.tables[cid] = list(table)
        self.hashes[cid] = list(self.hashes.get(parent.request_id, []))
        self.num_hashed[cid] = self.num_hashed.get(parent.request_id, 0)
        self.log.add(RequestForked(self.log.step, cid, parent.request_id, tuple(b.id for b in table),
                                   child.num_tokens, child.num_computed_tokens,
                                   tuple(child.token_ids), child.arrival_index))

    def free(self, req: Request) -> None:
        """Release the request's blocks, tail first, so tails are evicted before heads."""
        rid = req.request_id
        self._ids.pop(rid, None)
        table = self.tables.pop(rid, None)
        if table:
            table.reverse()
            self.pool.release_all(table, rid)
        self.num_hashed.pop(rid, None)
        if req.status.is_finished:
            self.hashes.pop(rid, None)

    def step_computed(self) -> None:
        """The step's forward ran: the blocks hashed at schedule now hold their K/V."""
        self.cached_this_step.clear()

    def uncache_uncomputed(self) -> int:
        """The step's forward failed: forget the hashes given at schedule (their K/V was
        never written, a hit on them would read garbage). Returns how many."""
        n = self._forget([b for b in self.cached_this_step if b.hash is not None],
                         EvictionReason.ROLLBACK)
        self.cached_this_step.clear()
        return n

    def take_cow_pairs(self) -> list[tuple[int, int]]:
        out, self.cow_pairs = self.cow_pairs, []
        return out

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash (blocks in use keep their data). Returns how many."""
        n = self._forget(list(self.pool.cached.values()), EvictionReason.RESET)
        self.log.add(PrefixCacheReset(self.log.step))
        return n

    def _forget(self, blocks: list[Block], reason: EvictionReason) -> int:
        """Drop these blocks' hashes (a reset or a rollback, not LRU pressure)."""
        for b in blocks:
            self.pool.uncache(b, reason)
        return len(blocks)

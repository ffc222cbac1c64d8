"""The miss-cause book: evicted vs cold needs the dropped hashes, and it keeps only the
most recently dropped ``max_remembered`` of them."""

import pytest

from engine.core import CacheConfig, EventLog, KVCacheManager
from engine.core.block_pool import Block
from engine.core.miss_causes import (
    MAX_REMEMBERED, MIN_REMEMBERED, MissCauses, default_max_remembered,
)

from tests.core.driver import req


def block(i, h, parent=None, tokens=(0,)):
    b = Block(i)
    b.hash, b.parent_hash, b.token_ids = h, parent, tokens
    return b


def test_remembers_only_the_most_recently_dropped_hashes():
    book = MissCauses(block_size=4, max_remembered=2)
    blocks = [block(i, f"h{i}") for i in range(3)]
    for b in blocks:
        book.on_cached(b)
    assert book.num_remembered == 0  # cached hashes are answered by the pool's map
    for b in blocks:
        book.on_uncached(b)
    assert book.num_remembered == 2
    assert [book.was_cached(f"h{i}", {}) for i in range(3)] == [False, True, True]
    book.on_uncached(blocks[1])  # dropped again: now the most recent
    book.on_uncached(block(9, "h9"))
    assert [book.was_cached(h, {}) for h in ("h1", "h2", "h9")] == [True, False, True]
    book.on_cached(blocks[1])  # cached again: no longer remembered as dropped
    assert book.num_remembered == 1 and book.was_cached("h1", {"h1": blocks[1]})
    with pytest.raises(ValueError, match="max_remembered"):
        MissCauses(4, 0)


def test_default_bound_is_four_pool_fulls_clamped():
    assert default_max_remembered(10) == MIN_REMEMBERED == 4096
    assert default_max_remembered(5000) == 20000
    assert default_max_remembered(10**6) == MAX_REMEMBERED == 262144


def evicted_then_looked_up(max_remembered):
    """a's 3 blocks are cached, then all evicted by "fill"; a2 looks the prompt up again."""
    log = EventLog()
    kv = KVCacheManager(CacheConfig(block_size=4, num_blocks=4), log,
                        max_remembered_hashes=max_remembered)
    a = req("a", range(12))
    assert kv.allocate_slots(a, 12)
    kv.free(a)
    fill = req("fill", range(100, 116))
    assert kv.allocate_slots(fill, 16)  # takes all 4 blocks: evicts a's 3 hashes
    assert [e.reason for e in log.drain() if e.type == "block_evicted"] == ["reuse"] * 3
    kv.free(fill)
    return kv.lookup(req("a2", range(12)))


def test_past_the_bound_an_evicted_block_reads_cold():
    m = evicted_then_looked_up(max_remembered=8)
    assert (m.num_tokens, m.miss_evicted, m.miss_cold, m.miss_partial) == (0, 8, 0, 4)
    # a bound of 1 remembers only the last dropped hash (a's block 0, freed last)
    m = evicted_then_looked_up(max_remembered=1)
    assert (m.num_tokens, m.miss_evicted, m.miss_cold, m.miss_partial) == (0, 4, 4, 4)

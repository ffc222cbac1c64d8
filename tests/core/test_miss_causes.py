"""The miss-cause book: evicted vs cold needs the dropped hashes, and it keeps only the
most recently dropped ``max_remembered`` of them."""

from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.core import CacheConfig, EventLog, KVCacheManager
from engine.core.block_pool import Block
from engine.core.miss_causes import (
    MAX_REMEMBERED, MIN_REMEMBERED, MissCauses, default_max_remembered,
)

from tests.core.driver import make_scheduler, req
from tests.core.test_invariants import op, run_ops


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
    book.on_cached(blocks[1])  # cached again and dropped again: now the most recent
    book.on_uncached(blocks[1])
    assert book.num_remembered == 2
    book.on_cached(b9 := block(9, "h9"))
    book.on_uncached(b9)
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


def test_a_mid_block_divergence_is_seen_while_any_block_with_that_start_is_cached():
    """Two cached children of p start with token 7; the one cached last is dropped. A
    prompt diverging from them inside block 1 is still partial (the older one is
    cached), and cold once both are gone."""
    book = MissCauses(block_size=2, max_remembered=8)
    p, older, newer = block(0, "p", None, (1, 2)), block(1, "a", "p", (7, 1)), block(2, "b", "p", (7, 2))
    book.cached([p, older])
    book.cached([newer])
    book.uncached([newer])
    cached = {"p": p, "a": older}
    # tokens 1 2 | 7 3 | 5: block 1 ("c") was never cached; 1 hit block
    assert book.classify([1, 2, 7, 3, 5], ["p", "c"], 1, cached) == (0, 0, 3)
    assert book.classify([1, 2, 8, 3, 5], ["p", "d"], 1, cached) == (2, 0, 1)  # another start
    book.uncached([older])
    assert book.classify([1, 2, 7, 3, 5], ["p", "c"], 1, {"p": p}) == (2, 0, 1)


class SpecBook:
    """The book as its docstring defines it, one block at a time: an OrderedDict of the
    dropped hashes (oldest drop first, the oldest forgotten past the bound) and a scan of
    every cached block for a mid-block divergence (the previous book, per block)."""

    def __init__(self, block_size, max_remembered):
        self.bs, self.max_remembered, self.dropped = block_size, max_remembered, OrderedDict()

    def cached(self, blocks):
        for b in blocks:
            self.dropped.pop(b.hash, None)

    def uncached(self, blocks):
        for b in blocks:
            self.dropped.pop(b.hash, None)
            self.dropped[b.hash] = None
            if len(self.dropped) > self.max_remembered:
                self.dropped.popitem(last=False)

    def classify(self, token_ids, hashes, num_hit_blocks, cached):
        bs, n = self.bs, len(token_ids)
        cold = evicted = 0
        for i in range(num_hit_blocks, min(n // bs, (n - 1) // bs)):
            parent = hashes[i - 1] if i else None
            if hashes[i] in cached or hashes[i] in self.dropped:
                evicted += bs
            elif i == num_hit_blocks and any(b.parent_hash == parent and b.token_ids[0] == token_ids[i * bs]
                                             for b in cached.values()):
                pass  # partial
            else:
                cold += bs
        return cold, evicted, n - num_hit_blocks * bs - cold - evicted


def checked_against_spec(s, max_remembered):
    """Give scheduler ``s`` (no request yet) a book of ``max_remembered`` hashes whose
    every classification and size is checked against ``SpecBook``'s; returns a list
    whose one item counts the classifications."""
    book, spec = MissCauses(s.kv.block_size, max_remembered), SpecBook(s.kv.block_size, max_remembered)
    s.kv.misses, pool = book, s.kv.pool

    def cached(blocks):
        book.cached(blocks)
        spec.cached(blocks)

    def uncached(blocks):
        book.uncached(blocks)
        spec.uncached(blocks)
        assert book.num_remembered == len(spec.dropped)
        assert all(book.was_cached(h, {}) for h in spec.dropped)

    pool._on_cached, pool._on_uncached = cached, uncached
    calls = [0]
    real = book.classify

    def classify(token_ids, hashes, num_hit_blocks, cached_map):
        want = spec.classify(token_ids, hashes, num_hit_blocks, cached_map)
        assert real(token_ids, hashes, num_hit_blocks, cached_map) == want
        calls[0] += 1
        return want

    book.classify = classify
    return calls


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), max_remembered=st.integers(1, 6),
       chunk=st.sampled_from([3, 8, 64]))
def test_the_book_classifies_as_its_definition_on_random_operations(ops, max_remembered, chunk):
    """Random adds, steps, aborts and resets on a small pool (evictions, preemptions,
    prompts diverging mid-block): every admission's causes equal ``SpecBook``'s, with
    bounds small enough that hashes are forgotten often."""
    s = make_scheduler(block_size=4, num_blocks=10, max_model_len=40, budget=chunk, max_num_seqs=4)
    checked_against_spec(s, max_remembered)
    run_ops(s, ops, lambda s: None)

"""The remembered lookup of an admission that did not fit (``KVCacheManager._unfit``).

A waiting head that cannot get its blocks is looked up again at every step; the manager
keeps its match while the pool's ``watched`` says none of its hit blocks changed, and
reads only what may have been cached since. Here every lookup, remembered or not, is
checked against the pool's true state, and whole runs against runs that never remember.
"""

from __future__ import annotations

import random

import pytest

from engine.core import CacheConfig, EventLog, KVCacheManager, Scheduler, SchedulerConfig
from engine.core.block_pool import _UNWATCHED

from tests.core.driver import req, step


def truth(kv: KVCacheManager, r) -> tuple[list[int], int]:
    """The hit run a lookup must find now (block ids) and how many of it no request holds."""
    bs = kv.block_size
    hit = []
    for h in kv.hashes[r.request_id][:(r.num_tokens - 1) // bs]:
        b = kv.pool.cached.get(h)
        if b is None:
            break
        hit.append(b)
    return [b.id for b in hit], sum(b.ref_count == 0 for b in hit)


def conversations(seed: int, n: int = 60) -> list[tuple[int, list[int], int, str]]:
    """(arrival step, prompt, max_tokens, client): turns of a few conversations, each turn's prompt
    the last one's plus new tokens, so later turns hit what earlier ones cached."""
    rng = random.Random(seed)
    convs = [[rng.randrange(1, 500) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    out, at = [], 0
    for _ in range(n):
        c = rng.randrange(len(convs))
        if len(convs[c]) > 90:  # a new conversation in its place
            convs[c] = [rng.randrange(1, 500) for _ in range(rng.randrange(4, 40))]
        convs[c] = convs[c] + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))]
        at += rng.choice((0, 0, 1, 3))
        out.append((at, list(convs[c]), rng.randrange(1, 10), f"client{c % 3}"))
    return out


def run(seed: int, keep_events: bool, remember: bool, monkeypatch, checks: dict,
        policy: str = "fcfs") -> list:
    """Every step's scheduled (id, start, tokens, block table) and preemptions. Under
    "fair" a request behind the unfit head may be admitted, hitting the head's blocks."""
    s = Scheduler(SchedulerConfig(max_model_len=128, max_num_batched_tokens=24, max_num_seqs=6,
                                  policy=policy),
                  CacheConfig(block_size=4, num_blocks=40), EventLog(enabled=keep_events))
    lookup = KVCacheManager.lookup

    def checked(kv, r, classify=True):
        if not remember:
            kv._unfit = None
        u = kv._unfit
        same = u is not None and u[0] is r
        kv.hasher.full_blocks(r.token_ids, kv.block_size, kv.hashes.setdefault(r.request_id, []))
        want = truth(kv, r)
        m = lookup(kv, r, classify)
        assert [b.id for b in m.blocks] == want[0]
        assert m.num_tokens == len(want[0]) * kv.block_size
        if m.num_free_hits >= 0:
            assert m.num_free_hits == want[1]
        checks["lookups"] += 1
        checks["remembered" if same and u[2] is kv.pool.watched else "stale" if same else "new"] += 1
        return m

    monkeypatch.setattr(KVCacheManager, "lookup", checked)
    todo = conversations(seed)
    trail, k, i = [], 0, 0
    while i < len(todo) or s.has_unfinished_requests():
        while i < len(todo) and todo[i][0] <= k:
            r = req(f"r{i}", todo[i][1], max_tokens=todo[i][2])
            r.client = todo[i][3]
            s.add_request(r)
            i += 1
        out, _, _ = step(s)
        trail.append(([(x.request_id, x.start_position, len(x.token_ids), tuple(x.block_table))
                       for x in out.scheduled], tuple(out.preempted)))
        s.log.drain()
        k += 1
        assert k < 5000
    monkeypatch.undo()
    return trail


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
@pytest.mark.parametrize("keep_events", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_a_remembered_lookup_is_the_pool_s_truth_and_changes_no_decision(seed, keep_events, policy,
                                                                         monkeypatch):
    with_memory = {"lookups": 0, "remembered": 0, "stale": 0, "new": 0}
    without = dict(with_memory)
    a = run(seed, keep_events, True, monkeypatch, with_memory, policy)
    b = run(seed, keep_events, False, monkeypatch, without, policy)
    assert a == b
    assert with_memory["lookups"] == without["lookups"] and without["remembered"] == 0


def test_the_runs_above_remember_and_forget():
    """The differential test above can fail only if its runs take both paths."""
    for policy in ("fcfs", "fair"):
        totals = {"lookups": 0, "remembered": 0, "stale": 0, "new": 0}
        mp = pytest.MonkeyPatch()
        try:
            for seed in range(6):
                run(seed, False, True, mp, totals, policy)
        finally:
            mp.undo()
        print(policy, totals)
        assert totals["remembered"] > 50 and totals["stale"] > 10, (policy, totals)


def unfit_head():
    """Block size 4, 13 blocks: "a" (3 full blocks) cached and freed; "hog" holds 9 blocks;
    "b" (a's prompt + 7 tokens: 5 blocks, its first 3 hit a's) needs 3 free hits + 2 new
    blocks, and 4 are free (a's 3 and one uncached)."""
    s = Scheduler(SchedulerConfig(max_model_len=48, max_num_batched_tokens=64, max_num_seqs=4),
                  CacheConfig(block_size=4, num_blocks=13), EventLog(enabled=False))
    s.add_request(req("a", range(13), max_tokens=1))
    step(s)
    s.add_request(req("hog", range(100, 132), max_tokens=8))
    step(s)
    s.add_request(req("b", list(range(13)) + list(range(50, 57)), max_tokens=2))
    out, _, _ = step(s)
    assert [x.request_id for x in out.scheduled] == ["hog"]  # b did not fit
    assert s.kv.pool.num_free == 4
    return s, s.requests["b"]


def test_the_head_s_hits_are_remembered_until_one_changes():
    s, b = unfit_head()
    kv = s.kv
    watched = kv.pool.watched
    hits = [blk.id for blk in kv._unfit[1].blocks]
    assert len(hits) == 3 and {blk.id for blk in watched} == set(hits)
    m = kv.lookup(b, classify=False)
    assert [blk.id for blk in m.blocks] == hits and m.num_free_hits == 3
    assert kv.pool.watched is watched  # nothing changed: remembered
    (taken,) = kv.pool.take_many(1)  # the free queue's head: the uncached block
    assert taken.id not in hits and kv.pool.watched is watched
    (taken,) = kv.pool.take_many(1)  # then the least recently used cached one: b's last hit
    assert taken.id == hits[-1] and kv.pool.watched is _UNWATCHED
    m = kv.lookup(b, classify=False)
    assert [blk.id for blk in m.blocks] == truth(kv, b)[0] == hits[:2]


def test_a_hit_block_referenced_or_released_forgets_the_lookup():
    s, b = unfit_head()
    kv = s.kv
    first = kv._unfit[1].blocks[0]
    kv.pool.touch(first)  # its ref count 0 -> 1: one free hit fewer
    assert kv.pool.watched is _UNWATCHED
    m = kv.lookup(b, classify=False)
    assert kv.blocks_needed(b, 8, m) == 2 + 2  # 2 free hits + 2 new blocks
    assert not kv.allocate_slots(b, 8, m)  # 4 > 3 free: remembered again
    watched = kv.pool.watched
    assert watched is not _UNWATCHED and kv.lookup(b, classify=False).num_free_hits == 2
    kv.pool.release_all([first], "test")  # back to 0
    assert kv.pool.watched is _UNWATCHED
    assert kv.lookup(b, classify=False).num_free_hits == -1  # looked up afresh, counted later


def test_blocks_cached_since_lengthen_the_remembered_run():
    s, b = unfit_head()
    kv = s.kv
    watched = kv.pool.watched
    hashes = kv.hashes["b"]
    # b's fourth block (tokens 12, 50, 51, 52) becomes cached in the free uncached block
    fresh = next(x for x in kv.pool.blocks if x.ref_count == 0 and x.hash is None)
    assert kv.pool.cache(fresh, hashes[3], hashes[2], (12, 50, 51, 52))
    assert kv.pool.watched is watched  # caching a block changes none of the watched ones
    m = kv.lookup(b, classify=False)
    assert [x.id for x in m.blocks] == truth(kv, b)[0] and m.blocks[-1] is fresh
    assert m.num_free_hits == 4 and fresh in kv.pool.watched
    assert kv.blocks_needed(b, 4, m) == 4 + 1

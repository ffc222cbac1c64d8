"""The prefix locator and the ledger on hand-made event streams (pure, no sockets):
every break reason, exact blocks and tokens, tiers, churn."""

from __future__ import annotations

import pytest

from engine.attach.ledger import FleetLedger
from engine.attach.locator import (
    BELOW_BLOCK, CLEARED, DIVERGED, EVICTED, NEVER_STORED, OTHER_KEYS, PARTIAL_BLOCK, RESTART,
    WHOLE_PROMPT, LocateError, check_token_ids, locate,
)
from engine.attach.prefix_match import stream_chain
from engine.events.schema.types import KVAllCleared, KVBlockRemoved, KVBlockStored, KVSegment

BS = 4
A = list(range(100, 116))  # 4 blocks


def h(i: int) -> str:
    return format(i, "016x")


def fold(*events) -> FleetLedger:
    led = FleetLedger()
    for step, e in enumerate(events):
        led.apply_events([e], step=step)
    return led


def stored(step, hashes, parent, tokens, pod="p", medium="GPU", ts=None, bs=BS):
    return KVBlockStored(step, pod, tuple(hashes), parent, tuple(tokens), bs,
                         float(step if ts is None else ts), medium)


def removed(step, hashes, pod="p", medium="GPU", ts=None):
    return KVBlockRemoved(step, pod, tuple(hashes), float(step if ts is None else ts), medium)


def one(led: FleetLedger, ids, pod="p"):
    (loc,) = locate(led.state.to_snapshot(), ids, led, [pod])
    return loc


def test_token_walk_reasons_evicted_diverged_partial_and_below_a_block():
    led = fold(stored(0, [h(1), h(2), h(3)], None, A[:12]),
               stored(1, [h(4)], h(1), [7, 7, 7, 7]),  # a branch after block 0
               removed(5, [h(3)], ts=50.0),
               stored(6, [h(9)], None, [1, 2, 3, 4]))
    # the chain breaks at block 2: evicted at ts 50, step 2 of the fold
    loc = one(led, A[:14])
    d = loc.to_dict()
    assert (d["cached_blocks"], d["cached_tokens"], d["hit_tokens"], d["tier"]) == (2, 8, 8, "GPU")
    assert loc.scheme is None and d["method"] == "token ids"
    b = d["break"]
    assert (b["reason"], b["block"], b["token"], b["hash"], b["ts"], b["step"]) == (EVICTED, 2, 8, h(3), 50.0, 2)
    assert b["age_s"] == 0.0  # the eviction is the pod's latest ts (the later store says ts 6)
    # diverged: after block 0 the pod caches [104..107] and [7,7,7,7]; the prompt has [104, 105, 0, 0]
    d = one(led, A[:4] + [104, 105, 0, 0, 1]).to_dict()
    assert (d["cached_blocks"], d["break"]["reason"], d["break"]["block"], d["break"]["token"]) == (1, DIVERGED, 1, 6)
    # partial: every full block cached, 3 tokens left over
    d = one(led, [1, 2, 3, 4, 5, 6, 7]).to_dict()
    assert (d["cached_tokens"], d["hit_tokens"], d["break"]["reason"], d["break"]["token"]) == (4, 4, PARTIAL_BLOCK, 4)
    # whole prompt: the last token is recomputed, so the hit is one block less
    d = one(led, [1, 2, 3, 4]).to_dict()
    assert (d["cached_tokens"], d["hit_tokens"], d["break"]["reason"]) == (4, 0, WHOLE_PROMPT)
    # shorter than a block (vLLM #54607): nothing can hit
    d = one(led, [1, 2, 3]).to_dict()
    assert (d["cached_blocks"], d["break"]["reason"], d["break"]["block"]) == (0, BELOW_BLOCK, None)
    # never stored: no root starts with 42, and no removal of such a block was seen
    d = one(led, [42] * 9).to_dict()
    assert (d["cached_blocks"], d["break"]["reason"], d["break"]["token"]) == (0, DIVERGED, 0)
    led2 = fold(stored(0, [h(1)], None, A[:4]))
    d = one(led2, A[:4] + [9] * 5).to_dict()
    assert (d["cached_blocks"], d["break"]["reason"], d["break"]["block"]) == (1, NEVER_STORED, 1)


def test_by_hash_other_keys_orphans_and_a_stored_again_block():
    ids = list(range(1, 14))  # 3 full blocks and one token
    chain = stream_chain(ids, BS, "sha256")
    led = fold(stored(0, chain, None, ids[:12]),
               removed(1, [chain[1]], ts=10.0))
    loc = one(led, ids)
    assert loc.scheme == "sha256"
    d = loc.to_dict()
    assert (d["method"], d["cached_blocks"], d["break"]["reason"], d["break"]["block"]) == ("hash", 1, EVICTED, 1)
    assert d["break"]["cached_after"] == 1  # block 2 is still cached, orphaned below the hole
    led.apply_events([stored(2, [chain[1]], chain[0], ids[4:8])], step=2)  # stored again
    d = one(led, ids).to_dict()
    assert (d["cached_blocks"], d["hit_tokens"], d["break"]["reason"]) == (3, 12, PARTIAL_BLOCK)
    assert led.pods["p"].stored_again_after_removal == 1
    # the same tokens under another hash (a LoRA, a salt): not the prompt's block
    other = fold(stored(0, [chain[0], "ff" * 8], None, ids[:8]))
    d = one(other, ids).to_dict()
    assert (d["cached_blocks"], d["break"]["reason"], d["break"]["block"]) == (1, OTHER_KEYS, 1)


def test_tiers_placeholders_clears_restarts_and_churn():
    gpu = stored(0, [h(1), h(2), h(3)], None, A[:12])
    cpu = KVBlockStored(1, "p", (h(1), h(2), h(3)), None, (), 0, 1.0, "CPU_PINNED")  # placeholders
    led = fold(gpu, cpu, removed(2, [h(3)], ts=20.0), removed(3, [h(2)], ts=30.0))
    loc = one(led, A[:13])
    by_tier = {t.medium: t for t in loc.tiers}
    assert [t.medium for t in loc.tiers] == ["GPU", "CPU_PINNED"]
    assert by_tier["GPU"].cached_blocks == 1 and by_tier["GPU"].chain_break.reason == EVICTED
    assert by_tier["GPU"].chain_break.ts == 30.0
    # the offload tier holds all three: found by the hashes the GPU tier's removals name
    assert by_tier["CPU_PINNED"].cached_blocks == 3 and by_tier["CPU_PINNED"].method == "hash"
    d = loc.to_dict()
    assert (d["tier"], d["cached_tokens"], d["hit_tokens"]) == ("CPU_PINNED", 12, 12)
    p = led.pods["p"]
    assert (p.evicted, p.evicted_unreused, p.placeholder_stores) == (2, 2, 3)
    assert p.churn()["evicted_before_reuse_share"] == 1.0
    # a clear and a restart: what was cached left, and says so
    led = fold(stored(0, [h(1)], None, A[:4]), KVAllCleared(1, "p", 5.0))
    d = one(led, A[:5]).to_dict()
    assert (d["break"]["reason"], d["break"]["ts"]) == (CLEARED, 5.0)
    assert led.pods["p"].evicted == 0  # a clear is no eviction
    led = fold(stored(0, [h(1)], None, A[:4], ts=3.0), KVSegment(1, "p", 1, 0, "restart"))
    assert one(led, A[:5]).to_dict()["break"]["reason"] == RESTART


def test_copies_leave_with_the_last_and_reuse_counts():
    led = fold(stored(0, [h(1), h(2)], None, A[:8]),
               stored(1, [h(2)], h(1), A[4:8]),  # a recomputed second copy
               stored(2, [h(5)], h(1), [9, 9, 9, 9]),  # a branch: block 1 certainly reused
               removed(3, [h(2)]), removed(4, [h(2), h(1)]))
    p = led.pods["p"]
    assert p.duplicate_stores == 1 and p.evicted == 2 and p.evicted_unreused == 1  # h(1) was reused


@pytest.mark.parametrize("bad, says", [([], "empty"), ("abc", "JSON array"), ([1, -2], "token_ids[1]"),
                                       ([1, True], "token_ids[1]"), ([1.5], "token_ids[0]")])
def test_bad_token_ids_are_refused_by_name(bad, says):
    with pytest.raises(LocateError, match=says.replace("[", r"\[").replace("]", r"\]")):
        check_token_ids(bad)


def test_churn_counts_the_last_minute_of_the_pod_clock():
    events = [stored(i, [h(100 + i)], None, [i, i, i, i], ts=float(i * 10)) for i in range(10)]
    events += [removed(10 + i, [h(100 + i)], ts=95.0 + i) for i in range(3)]
    led = fold(*events)
    c = led.pods["p"].churn()
    # the pod's clock is at 97: stores at 40..90 (6) and 3 removals are in the last 60 s
    assert (c["stored_per_min"], c["removed_per_min"], c["evicted_per_min"]) == (6.0, 3.0, 3.0)
    assert (c["evicted_blocks"], c["evicted_before_reuse"], c["recomputed_after_removal"]) == (3, 3, 0)


def test_placement_counts_what_a_pod_hit_against_what_any_pod_held():
    sys_ = [h(1), h(2), h(3)]
    led = fold(stored(0, sys_, None, A[:12], pod="a"),  # a: the system prompt (a new request)
               stored(1, [h(4)], h(3), [1, 1, 1, 1], pod="a"),  # the same request's next chunk: left out
               stored(2, [h(5)], h(3), [2, 2, 2, 2], pod="a"),  # a second request branches: hit 3 of 4
               stored(3, sys_ + [h(6)], None, A[:12] + [3, 3, 3, 3], pod="b"))  # b computed it all again
    a, b = led.pods["a"].placement(), led.pods["b"].placement()
    assert (a["placed_chains"], a["placed_blocks"], a["achieved_blocks"], a["reachable_blocks"]) == (2, 7, 3, 3)
    assert (b["placed_chains"], b["placed_blocks"], b["achieved_blocks"], b["reachable_blocks"]) == (1, 4, 0, 3)
    assert (a["achieved_hit_rate"], b["reachable_hit_rate"]) == (3 / 7, 3 / 4)
    from engine.attach.fleet import fleet_placement, pod_row

    total = fleet_placement({n: pod_row({}, led.state.pods[n], led.pods[n]) for n in ("a", "b")})
    assert (total["placed_blocks"], total["achieved_blocks"], total["reachable_blocks"], total["lost_blocks"]) \
        == (11, 3, 6, 3)


def test_every_missed_token_gets_one_cause_and_they_add_up():
    led = fold(stored(0, [h(1), h(2), h(3)], None, A[:12]), removed(1, [h(3)], ts=5.0))
    cases = {  # prompt -> (hit, misses by cause)
        tuple(A[:14]): (8, {EVICTED: 4, PARTIAL_BLOCK: 2}),  # blocks 0, 1 hit; block 2 evicted; 2 left over
        tuple(A[:8]): (4, {"last_token": 4}),  # whole blocks: the last one is recomputed
        tuple(A[:3]): (0, {BELOW_BLOCK: 3}),  # shorter than a block
        tuple(A[:4] + [0] * 9): (4, {DIVERGED: 8, PARTIAL_BLOCK: 1}),
    }
    for prompt, (hit, misses) in cases.items():
        d = one(led, list(prompt)).to_dict()
        assert (d["hit_tokens"], d["misses"]) == (hit, misses), prompt
        assert d["hit_tokens"] + sum(d["misses"].values()) == len(prompt)
        for t in d["tiers"]:
            assert t["hit_tokens"] + sum(t["misses"].values()) == len(prompt)

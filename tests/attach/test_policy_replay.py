"""What each routing policy would have done with an attached stream, and the miss explainer
summed per pod, on hand-made event streams (pure, no sockets): exact hits per policy, the
causes of every missed token, and that they add up to the misses per pod."""

from __future__ import annotations

import pytest

from engine.attach.fleet import as_engine, miss_explainer, pod_row
from engine.attach.ledger import FleetLedger
from engine.attach.locator import locate
from engine.attach.policy_replay import LOAD_WINDOW_S, PolicyReplay, ReplayPod
from engine.events.schema.types import KVBlockRemoved, KVBlockStored, KVSegment
from engine.simulate.routers import ROUTERS

BS = 16


def h(name: str) -> str:
    return name.encode().hex().rjust(16, "0")


def toks(name: str) -> list[int]:
    """A block's tokens, one distinct run per name."""
    base = sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 10_000 * 100
    return list(range(base, base + BS))


def stored(ts, pod, names, parent=None, tokens=None):
    return KVBlockStored(0, pod, tuple(h(n) for n in names), None if parent is None else h(parent),
                         tuple(tokens if tokens is not None else [t for n in names for t in toks(n)]),
                         BS, float(ts), "GPU")


def fold(led: FleetLedger, *events) -> FleetLedger:
    for step, e in enumerate(events):
        led.apply_events([e], step=step)
    return led


def shared_prompt_stream(led: FleetLedger) -> FleetLedger:
    """Two pods, one system prompt (blocks S1 S2), four requests: a, b, then a branch on each."""
    return fold(led,
                stored(0, "a", ["S1", "S2", "X1"]),
                stored(1, "b", ["S1", "S2", "X2"]),  # b recomputes what a held
                stored(2, "a", ["X3"], "S2"),  # a branch below S2: a hit of 2 blocks
                stored(3, "b", ["X4"], "S2"))


def test_each_policy_routes_the_same_requests_and_hits_exactly():
    replay = PolicyReplay(["a", "b"])
    led = shared_prompt_stream(FleetLedger(replay=replay))
    s = replay.summary()
    assert (s["requests"], s["blocks"], s["achieved_blocks"], s["reachable_blocks"]) == (4, 12, 4, 6)
    assert (s["achieved_hit_rate"], s["reachable_hit_rate"]) == (4 / 12, 6 / 12)
    # the same totals as the ledger's placement, summed over the pods
    assert sum(p.achieved_blocks for p in led.pods.values()) == 4
    assert sum(p.reachable_blocks for p in led.pods.values()) == 6
    hits = {n: p["hit_blocks"] for n, p in s["policies"].items()}
    # round-robin, least-loaded and Dynamo (its in-flight cost) split the requests a, b, a, b:
    # only the two branches hit; the prefix scorers and the oracle keep all on pod a: 2+2+2
    assert hits == {"round-robin": 4, "least-loaded": 4, "precise-prefix": 6, "approx-prefix": 6,
                    "dynamo": 4, "oracle": 6}
    assert list(s["policies"]) == list(ROUTERS)
    assert s["policies"]["round-robin"]["requests_per_pod"] == {"a": 2, "b": 2}
    assert s["policies"]["precise-prefix"]["requests_per_pod"] == {"a": 4, "b": 0}
    assert s["policies"]["oracle"]["hit_rate"] == 0.5
    assert s["capacity_blocks"] == {"a": None, "b": None}  # neither pod ever evicted
    # over time: one point per second of engine time, cumulative
    series = replay.series()
    assert [p["requests"] for p in series] == [1, 2, 3, 4]
    assert [p["hit_blocks"]["precise-prefix"] for p in series] == [0, 2, 4, 6]
    assert [p["reachable_blocks"] for p in series] == [0, 2, 4, 6]


def test_replayed_pods_evict_at_the_real_pools_peak_and_finish_after_the_window():
    pod = ReplayPod("a")
    pod.capacity = 2
    hit, new, gone = pod.admit("r0", 0.0, ["x", "y", "z"])
    assert (hit, new, gone) == (0, ["x", "y", "z"], ["z"])  # the tail goes first, as vLLM frees it
    assert list(pod.cached) == ["y", "x"] and pod.load == 1
    assert pod.admit("r1", 1.0, ["x", "q"]) == (1, ["q"], ["y"])
    assert pod.expire(LOAD_WINDOW_S - 0.5) == [] and pod.expire(LOAD_WINDOW_S + 1.0) == ["r0", "r1"]
    free = ReplayPod("b")  # no pool size known: at most the fleet's peaks (a memory guard)
    free.guard = 3
    assert free.admit("r2", 0.0, ["a", "b", "c", "d"]) == (0, ["a", "b", "c", "d"], ["d"])
    # a pod's capacity is known from the events once it evicted: its peak cached blocks
    replay = PolicyReplay(["a", "b"], policies=["round-robin"])
    led = fold(FleetLedger(replay=replay), stored(0, "a", ["A1", "A2", "A3"]),
               KVBlockRemoved(1, "a", (h("A3"),), 1.0, "GPU"), stored(2, "b", ["B1"]))
    assert led.pods["a"].peak_blocks == 3
    assert replay.summary()["capacity_blocks"] == {"a": 3, "b": None}


def test_a_replay_refuses_unknown_policies_and_skips_offload_tiers():
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        PolicyReplay(["a"], policies=["nope"])
    with pytest.raises(ValueError, match="at least one pod"):
        PolicyReplay([])
    replay = PolicyReplay(["a"])
    fold(FleetLedger(replay=replay),
         KVBlockStored(0, "a", (h("C1"),), None, tuple(toks("C1")), BS, 0.0, "CPU"))
    assert replay.summary()["requests"] == 0 and replay.summary()["offload_tier_requests_skipped"] == 1


def test_every_missed_token_of_the_requests_seen_gets_one_cause_and_they_add_up_per_pod():
    led = shared_prompt_stream(FleetLedger())
    c = [stored(10, "c", ["R1"]),
         KVBlockRemoved(11, "c", (h("R1"),), 11.0, "GPU"),  # evicted
         stored(12, "c", ["R1", "R2"]),  # its first block was evicted: 2 blocks, evicted
         stored(13, "c", ["Q1"], tokens=toks("R1")),  # R1's tokens under another hash: other keys
         stored(14, "c", ["Z1"]),  # another first block: diverged from the cached roots
         stored(15, "c", ["W1"], "R1"),  # R1's only child is R2: a branch, tokens differ: diverged
         stored(16, "c", ["R2", "V1"], "R1"),  # R2 is cached already: a recomputed last block
         KVSegment(17, "c", 1, 0, "restart"),
         stored(18, "c", ["R1"])]  # lost in the restart
    fold(led, *c)
    rows = {p: pod_row({}, led.state.pods[p], led.pods[p]) for p in ("a", "b", "c")}
    assert rows["a"]["miss_tokens"] == {"never_stored": 3 * BS, "diverged": BS}
    assert rows["b"]["miss_tokens"] == {"never_stored": 3 * BS, "diverged": BS}
    assert rows["c"]["miss_tokens"] == {"never_stored": BS, "evicted": 2 * BS, "other_keys": BS,
                                        "diverged": 2 * BS, "last_token": 2 * BS, "restart": BS}
    for r in rows.values():  # the causes add up to the missed blocks' tokens, per pod
        assert r["missed_tokens"] == sum(r["miss_tokens"].values()) \
            == (r["placed_blocks"] - r["achieved_blocks"]) * BS
    # the locator's probes, summed per pod: they add up to the prompts less the hits
    snap = led.state.to_snapshot()
    prompts = [toks("S1") + toks("S2") + toks("X1") + [1, 2, 3], toks("S1")[:5]]
    for ids in prompts:
        for loc in locate(snap, ids, led, ["a", "b"]):
            led.pod(loc.pod).add_probe(loc.num_prompt_tokens, loc.hit_tokens, loc.misses())
    a = pod_row({}, led.state.pods["a"], led.pods["a"])
    assert (a["probes"], a["probe_prompt_tokens"], a["probe_hit_tokens"]) == (2, 56, 48)
    assert a["probe_misses"] == {"partial_block": 3, "below_block": 5}
    b = pod_row({}, led.state.pods["b"], led.pods["b"])
    assert b["probe_misses"] == {"diverged": BS, "partial_block": 3, "below_block": 5}
    for r in (a, b):
        assert sum(r["probe_misses"].values()) == r["probe_prompt_tokens"] - r["probe_hit_tokens"]
    # beside the engine's own three causes, where the pod's /metrics export them
    a["scraped"] = {"prefix_cache_miss_cold": 48.0, "prefix_cache_miss_evicted": 0.0,
                    "prefix_cache_miss_partial": 16.0}
    ex = {r["pod"]: r for r in miss_explainer({"a": a, "c": rows["c"]})}
    assert ex["a"]["engine"] == {"cold": 48.0, "evicted": 0.0, "partial": 16.0}
    assert ex["a"]["events_as_engine"] == {"cold": 48, "evicted": 0, "partial": 16}
    assert ex["c"]["engine"] is None
    assert ex["c"]["events_as_engine"] == {"cold": 2 * BS, "evicted": 3 * BS, "partial": 4 * BS}
    assert as_engine({"below_block": 5, "no_blocks": 2}) == {"cold": 2, "evicted": 0, "partial": 5}

"""kvscope attach against a synthetic publisher written from the format description:
both encodings, both replay layouts, gaps filled and not, restarts, unknown fields,
bytes hashes, a late join, tail loss, undecodable input."""

from __future__ import annotations

import json

import msgspec
import pytest

from engine.attach.pod_source import PodSource
from engine.store.commands import replay_json
from engine.store.runs import RunStore
from tests.attach.fake_publisher import FakePublisher, cleared, removed, stored
from tests.attach.helpers import (
    KVBlockRemoved, KVBlockStored, KVGap, KVSegment, cached, events_of, kinds, recorded, source,
    start_attach, wait_until,
)

BS = 4


def key(h) -> str:
    """How the run names a hash: 16 hex digits of a uint64, or the bytes in hex."""
    return h.hex() if isinstance(h, bytes) else format(h, "016x")


@pytest.fixture
def pubs():
    made: list[FakePublisher] = []

    def make(**kw) -> FakePublisher:
        made.append(FakePublisher(**kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture
def attached(tmp_path):
    servers = []

    def start(*pods, **kw):
        servers.append(start_attach(tmp_path, *pods, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def workload(h: list) -> list[list[dict]]:
    """Batches over hashes h[0..5]: a 3-block chain, a branch below its first block, an
    eviction, a leaf stored again (recomputed into a second copy, as vLLM v1 does)."""
    t = list(range(100, 100 + 6 * BS))
    return [
        [stored(h[0:3], None, t[0:12], BS)],
        [stored(h[3:5], h[0], t[12:20], BS)],  # a second request branches after block 0
        [removed([h[2]])],
        [stored([h[5]], h[4], t[20:24], BS), stored([h[4]], h[3], t[16:20], BS)],
    ]


@pytest.mark.parametrize("encoding", ["map", "array"])
@pytest.mark.parametrize("hashes", ["int", "bytes"])
def test_both_encodings_and_hash_kinds_fold_to_the_published_cache(pubs, attached, encoding, hashes):
    h = ([(1 << 63) + i for i in range(6)] if hashes == "int"
         else [bytes([i]) * 32 for i in range(6)])
    pub = pubs(encoding=encoding)
    srv = attached(source(pub))
    pub.wait_subscriber()
    for batch in workload(h):
        pub.publish(batch)
    want = {key(x) for x in (h[0], h[1], h[3], h[4], h[5])}
    wait_until(lambda: cached(srv) == want and srv.worker.num_steps >= 5, what="the cache")
    snap = srv.worker.state.to_snapshot().pods["pod-a"]
    by = {b.hash: b for b in snap.blocks}
    assert by[key(h[1])].parent == key(h[0]) and by[key(h[3])].parent == key(h[0])
    assert by[key(h[5])].parent == key(h[4]) and by[key(h[0])].parent is None
    assert by[key(h[3])].token_ids == (112, 113, 114, 115)
    assert (by[key(h[4])].reuses, by[key(h[4])].copies) == (0, 2)  # recomputed while cached
    assert by[key(h[0])].reuses == 1  # the branch: a second request shared block 0
    assert snap.block_size == BS and snap.removed_blocks == 1 and snap.unknown_removals == 0
    srv.stop()
    run, records = recorded(srv)
    assert run["kind"] == "attached" and run["finished_at"] is not None
    assert kinds(records) == ["kv_segment", "kv_block_stored", "kv_block_stored", "kv_block_removed",
                              "kv_block_stored", "kv_block_stored"]
    assert [r.metrics["source_seq"] for r in records] == [0, 0, 1, 2, 3]
    assert all(r.metrics["pod"] == "pod-a" and not r.metrics.get("replayed") for r in records[1:]), [r.metrics for r in records]
    assert [r.metrics["cached_blocks"]["pod-a"] for r in records] == [0, 3, 5, 4, 5]
    out = replay_json(RunStore(srv.options.db), srv.run_id, None)
    assert out["kind"] == "attached" and out["step"] == 4
    blocks = out["pods"]["pod-a"]["cached_blocks"]
    assert {b["hash"] for b in blocks} == want and all(b["num_tokens"] == BS for b in blocks)
    assert {b["hash"]: b["parent"] for b in blocks}[key(h[5])] == key(h[4])
    assert replay_json(RunStore(srv.options.db), srv.run_id, 1)["pods"]["pod-a"]["cached_blocks"] == [
        {"hash": key(x), "parent": p, "num_tokens": BS}
        for x, p in ((h[0], None), (h[1], key(h[0])), (h[2], key(h[1])))]
    json.dumps(out)  # JSON through and through


def test_unknown_fields_and_event_types_are_ignored(pubs, attached):
    pub = pubs(encoding="array")
    srv = attached(source(pub))
    pub.wait_subscriber()
    # vLLM 0.32's trailing fields in its order, then a newer engine's field and event type
    pub.publish([stored([1, 2], None, list(range(8)), BS, extra_keys=[None, ["salt"]], group_idx=0,
                        kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
                        locality="LOCAL", ownership=None, session_id="s1", future=[1]),
                 {"type": "BlockPinned", "block_hashes": [1]}])
    mp = pubs(encoding="map")
    srv2 = attached(source(mp, "pod-b"))
    mp.wait_subscriber()
    mp.publish([stored([3], None, list(range(4)), BS, ownership="tier-2", kv_cache_spec_kind="full",
                       future={"x": 1}),
                removed([3], locality="REMOTE", group_idx=1)])
    wait_until(lambda: cached(srv) == {key(1), key(2)}, what="pod-a")
    wait_until(lambda: srv2.worker.state.pods.get("pod-b") is not None
               and srv2.worker.state.pods["pod-b"].removed_blocks == 1, what="pod-b")
    assert cached(srv2, "pod-b") == set()
    srv.stop()
    _, records = recorded(srv)
    assert records[-1].metrics["unknown_events"] == ["BlockPinned"]
    assert kinds(records) == ["kv_segment", "kv_block_stored"]
    e = records[-1].events[0]  # kept as sent (session_id aside), through the recording
    assert (e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window, e.extra_keys,
            e.locality, e.ownership) == (0, "sliding_window", 128, (None, ["salt"]), "LOCAL", None)
    srv2.stop()
    _, records = recorded(srv2)
    st, rm = records[-1].events  # one batch, one step
    assert (st.ownership, st.kv_cache_spec_kind, st.group_idx) == ("tier-2", "full", None)
    assert (rm.locality, rm.group_idx, rm.ownership) == ("REMOTE", 1, None)


@pytest.mark.parametrize("layout", [2, 3])
def test_a_gap_is_filled_through_replay_in_either_layout(pubs, attached, layout):
    pub = pubs(replay_layout=layout)
    srv = attached(source(pub))
    pub.wait_subscriber()
    pub.publish([stored([10], None, [1, 2, 3, 4], BS)])
    pub.publish([stored([11], 10, [5, 6, 7, 8], BS)], drop_live=True)  # lost live, kept for replay
    pub.publish([stored([12], 11, [9, 10, 11, 12], BS)], drop_live=True)
    pub.publish([removed([10])])
    wait_until(lambda: cached(srv) == {key(11), key(12)}, what="the gap filled")
    srv.stop()
    _, records = recorded(srv)
    assert not events_of(records, KVGap)
    assert [(r.metrics["source_seq"], r.metrics["replayed"]) for r in records[1:]] == [
        (0, False), (1, True), (2, True), (3, False)]
    assert srv.subscriptions[0].replayed == 2


def test_a_gap_replay_cannot_fill_is_marked_in_the_run(pubs, attached):
    pub = pubs()
    srv = attached(source(pub))
    pub.wait_subscriber()
    pub.publish([stored([20, 21], None, list(range(8)), BS)])
    pub.publish([removed([21])], drop_live=True, drop_replay=True)  # gone for good
    pub.publish([stored([22], 20, [9, 9, 9, 9], BS)], drop_live=True)  # replayable
    pub.publish([removed([20])])
    wait_until(lambda: srv.worker.num_steps >= 5, what="the steps")
    wait_until(lambda: cached(srv) == {key(21), key(22)}, what="the cache")
    snap = srv.worker.state.to_snapshot().pods["pod-a"]
    assert snap.incomplete and len(snap.holes) == 1
    assert "batch 1 of segment 0 never arrived (not in the replay buffer)" == snap.holes[0].describe()
    srv.stop()
    _, records = recorded(srv)
    gaps = events_of(records, KVGap)
    assert [(g.first_seq, g.last_seq, g.reason) for g in gaps] == [(1, 1, "not in the replay buffer")]
    assert kinds(records) == ["kv_segment", "kv_block_stored", "kv_gap", "kv_block_stored",
                              "kv_block_removed"]
    out = replay_json(RunStore(srv.options.db), srv.run_id, None)["pods"]["pod-a"]
    assert out["incomplete"] and out["holes"] == [snap.holes[0].describe()]


def test_without_replay_a_gap_is_a_hole(pubs, attached):
    pub = pubs(replay=False)
    srv = attached(source(pub, replay=False))
    pub.wait_subscriber()
    pub.publish([stored([1], None, [1, 1, 1, 1], BS)])
    pub.publish([stored([2], 1, [2, 2, 2, 2], BS)], drop_live=True)
    pub.publish([stored([3], 2, [3, 3, 3, 3], BS)])
    wait_until(lambda: cached(srv) == {key(1), key(3)}, what="the cache")
    srv.stop()
    _, records = recorded(srv)
    assert [(g.first_seq, g.last_seq, g.reason) for g in events_of(records, KVGap)] == [
        (1, 1, "no replay endpoint")]


def test_a_publisher_restart_starts_a_new_segment_with_an_empty_cache(pubs, attached):
    pub = pubs()
    srv = attached(source(pub))
    pub.wait_subscriber()
    for i in range(5):
        pub.publish([stored([100 + i], None if i == 0 else 99 + i, [i] * BS, BS)])
    wait_until(lambda: len(cached(srv)) == 5, what="segment 0")
    pub.restart()
    pub.wait_subscriber()
    pub.publish([stored([7], None, [7] * BS, BS)])  # seq 0 again
    pub.publish([stored([8], 7, [8] * BS, BS)])
    wait_until(lambda: cached(srv) == {key(7), key(8)}, what="segment 1")
    srv.stop()
    _, records = recorded(srv)
    segs = events_of(records, KVSegment)
    assert [(s.segment, s.first_seq, s.reason) for s in segs] == [(0, 0, "attach"), (1, 0, "restart")]
    assert not events_of(records, KVGap)
    assert [r.metrics["segment"] for r in records if r.metrics.get("pod")][-2:] == [1, 1]
    store = RunStore(srv.options.db)
    restart_step = next(r.step for r in records if any(isinstance(e, KVSegment) and e.segment == 1
                                                       for e in r.events))
    assert len(store.state_at(srv.run_id, restart_step - 1).cached("pod-a")) == 5
    assert store.state_at(srv.run_id, restart_step).cached("pod-a") == set()


def test_a_late_joiner_rebuilds_from_replay_and_marks_what_replay_no_longer_has(pubs, attached):
    pub = pubs()
    pub.publish([stored([1], None, [1] * BS, BS)], drop_replay=True)  # older than the buffer
    pub.publish([stored([2], None, [2] * BS, BS)])
    pub.publish([stored([3], 2, [3] * BS, BS)])
    srv = attached(source(pub))
    wait_until(lambda: cached(srv) == {key(2), key(3)}, what="the history from replay")
    pub.wait_subscriber()
    pub.publish([removed([2])])
    wait_until(lambda: cached(srv) == {key(3)}, what="the live batch")
    srv.stop()
    _, records = recorded(srv)
    assert [(g.first_seq, g.last_seq, g.reason) for g in events_of(records, KVGap)] == [
        (0, 0, "published before the attach and no longer in the replay buffer")]
    assert [r.metrics.get("replayed") for r in records if isinstance(r.events[0], KVBlockStored)] == [
        True, True]


def test_a_batch_lost_at_the_tail_is_fetched_when_the_stream_goes_quiet(pubs, attached):
    pub = pubs()
    srv = attached(source(pub))
    pub.wait_subscriber()
    pub.publish([stored([1], None, [1] * BS, BS)])
    pub.publish([stored([2], 1, [2] * BS, BS)], drop_live=True)  # nothing after it reveals it
    wait_until(lambda: cached(srv) == {key(1), key(2)}, timeout=10, what="the tail batch")


def test_undecodable_input_is_a_marked_hole_and_junk_is_counted(pubs, attached):
    pub = pubs()
    srv = attached(source(pub))
    pub.wait_subscriber()
    pub.publish([stored([1], None, [1] * BS, BS)])
    pub.publish([], payload=b"\xc1 not msgpack")
    pub.publish([], payload=msgspec.msgpack.encode([0.0, [stored([5], None, [1, 2, 3], BS)]]))  # 3 != 4
    pub.send_raw([b"", b"short"])  # not three frames with an 8-byte seq
    pub.publish([stored([2], 1, [2] * BS, BS)])
    wait_until(lambda: cached(srv) == {key(1), key(2)}, what="the good batches")
    wait_until(lambda: srv.subscriptions[0].bad_messages == 1, what="the junk counted")
    srv.stop()
    _, records = recorded(srv)
    gaps = events_of(records, KVGap)
    assert [(g.first_seq, g.last_seq) for g in gaps] == [(1, 1), (2, 2)]
    assert gaps[0].reason.startswith("undecodable: payload is not msgpack")
    assert gaps[1].reason.startswith("undecodable: kv_block_stored")


def test_an_all_blocks_cleared_empties_only_its_pod(pubs, attached):
    a, b = pubs(), pubs(encoding="array", replay_layout=2)
    srv = attached(source(a, "pod-a"), source(b, "pod-b"))
    a.wait_subscriber()
    b.wait_subscriber()
    a.publish([stored([1, 2], None, list(range(8)), BS)])
    b.publish([stored([1, 3], None, list(range(8, 16)), BS)])
    wait_until(lambda: cached(srv, "pod-a") == {key(1), key(2)}
               and cached(srv, "pod-b") == {key(1), key(3)}, what="both pods")
    a.publish([cleared()])
    wait_until(lambda: not cached(srv, "pod-a"), what="pod-a cleared")
    assert cached(srv, "pod-b") == {key(1), key(3)}
    removed_events = events_of(recorded_after_stop(srv), KVBlockRemoved)
    assert removed_events == []


def recorded_after_stop(srv) -> list:
    srv.stop()
    return recorded(srv)[1]


def test_two_pods_with_different_caches_and_the_prefix_lookup_on_each(pubs, attached):
    from engine.attach.prefix_match import BY_TOKENS, longest_prefix

    system = list(range(1, 9))  # 2 blocks both pods computed
    a, b = pubs(), pubs(encoding="array", replay_layout=2)
    srv = attached(source(a, "pod-a"), source(b, "pod-b"))
    a.wait_subscriber()
    b.wait_subscriber()
    # pod-a: the system prompt and one question after it; pod-b: only the system prompt,
    # then a different question; bytes hashes on b, ints on a
    a.publish([stored([11, 12, 13, 14], None, system + [20, 21, 22, 23, 24, 25, 26, 27], BS)])
    b.publish([stored([b"\x01" * 32, b"\x02" * 32], None, system, BS)])
    b.publish([stored([b"\x03" * 32], b"\x02" * 32, [30, 31, 32, 33], BS)])
    wait_until(lambda: len(cached(srv, "pod-a")) == 4 and len(cached(srv, "pod-b")) == 3,
               what="both pods")
    pods = srv.worker.state.to_snapshot().pods
    prompt = system + [20, 21, 22, 23, 99, 98]  # shares 3 blocks with a, 2 with b
    ma, mb = longest_prefix(pods["pod-a"], prompt), longest_prefix(pods["pod-b"], prompt)
    assert (ma.method, ma.num_blocks, ma.hit_tokens, ma.hashes) == (BY_TOKENS, 3, 12,
                                                                    (key(11), key(12), key(13)))
    assert (mb.num_blocks, mb.hit_tokens, mb.hashes) == (2, 8, (key(b"\x01" * 32), key(b"\x02" * 32)))
    other = system + [30, 31, 32, 33, 7]
    assert longest_prefix(pods["pod-a"], other).num_blocks == 2
    assert longest_prefix(pods["pod-b"], other).num_blocks == 3
    srv.stop()
    _, records = recorded(srv)
    pods_seen = [r.metrics["pod"] for r in records]
    assert sorted(pods_seen) == ["pod-a", "pod-a", "pod-b", "pod-b", "pod-b"]
    assert records[-1].metrics["cached_blocks"] == {"pod-a": 4, "pod-b": 3}


@pytest.mark.parametrize("allow_remote", [False, True])
def test_a_wildcard_endpoint_is_bound_on_loopback_unless_allow_remote(allow_remote):
    """Pods that connect out (llm-d style) reach attach on tcp://*:PORT; without --allow-remote
    attach listens on 127.0.0.1 only, as serve keeps its KV event sockets to this machine."""
    import queue as queue_mod

    import zmq

    from engine.attach.subscription import PodSubscription
    from tests.attach.fake_publisher import free_port

    port = free_port()
    sub = PodSubscription(PodSource("p", f"tcp://*:{port}"), queue_mod.Queue(), allow_remote=allow_remote)
    try:
        want = f"tcp://{'0.0.0.0' if allow_remote else '127.0.0.1'}:{port}"
        assert sub.sub.getsockopt(zmq.LAST_ENDPOINT).decode() == want
        assert sub.bound == (f"tcp://*:{port}" if allow_remote else f"tcp://127.0.0.1:{port}")
    finally:
        sub.sub.close(0)

"""The ZMQ publisher, on real sockets, fed by the core's events (no model).

TCP sockets bind 127.0.0.1 only: the test subscriber binds and the publisher
connects (vLLM's rule for an endpoint without a wildcard); bind-mode publishers
use ipc:// or inproc://.
"""

import random
import socket
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
import zmq

from engine.core import ConfigError
from engine.events.schema.types import BlockCached, BlockEvicted, PrefixCacheReset
from engine.kv_events.config import KVEventsConfig
from engine.kv_events.publisher import KVEventsPublisher
from tests.core.driver import make_scheduler, req, step
from tests.kv_events.subscriber import END, Subscriber
from tests.kv_events.test_mapping import vllm_int
from tests.kv_events.test_wire import fixstr, uint64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publisher(endpoint: str, **kw) -> KVEventsPublisher:
    return KVEventsPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, **kw), "CPU")


@pytest.fixture
def opened():
    made = []

    def track(x):
        made.append(x)
        return x

    yield track
    for x in made:
        x.close()


class Core:
    """The scheduler with a fake runner; each step's events go to the publisher."""

    def __init__(self, pub: KVEventsPublisher, seed: int = 0, num_blocks: int = 24) -> None:
        self.s = make_scheduler(block_size=4, num_blocks=num_blocks, max_model_len=48, budget=16, max_num_seqs=4)
        self.pub = pub
        self.rng = random.Random(seed)
        self.n = 0

    def add(self) -> None:
        system = list(range(100, 111))
        tail = [self.rng.randrange(3, 90) for _ in range(self.rng.randrange(2, 14))]
        self.s.add_request(req(f"r{self.n}", (system if self.rng.random() < 0.6 else []) + tail,
                               max_tokens=self.rng.randrange(1, 9)))
        self.n += 1

    def step(self) -> None:
        if self.rng.random() < 0.5 or not self.s.has_unfinished_requests():
            self.add()
        step(self.s)
        self.pub.on_step(SimpleNamespace(ts=time.time(), events=self.s.log.drain()))

    def truth(self) -> set[int]:
        return {vllm_int(h) for h in self.s.kv.pool.cached}


def connected(pub: KVEventsPublisher, sub: Subscriber) -> None:
    """Publish harmless AllBlocksCleared batches until one arrives: the subscription is live."""
    for _ in range(200):
        pub.announce_cleared()
        if sub.sub.poll(50):
            break
    else:
        raise TimeoutError("the subscriber never connected")
    assert pub.flush()
    while sub.sub.poll(200):  # take every probe, so the test's own frames come next
        sub.next_seq = int.from_bytes(sub.sub.recv_multipart()[1], "big") + 1
    assert sub.next_seq == pub.seq


def test_frames_are_topic_seq_payload_byte_exact(opened):
    sub = opened(Subscriber())
    pub = opened(publisher(sub.endpoint, topic="kv@pod-1@tiny"))
    connected(pub, sub)
    first = pub.seq
    a, b = "aa" * 32, "bb" * 32
    pub.on_step(SimpleNamespace(ts=1.5, events=[BlockCached(1, 0, a, None, (1, 2)),
                                                BlockCached(1, 1, b, a, (3, 300))]))
    pub.on_step(SimpleNamespace(ts=2.0, events=[]))  # a step without KV events sends nothing
    pub.announce_cleared(2.5)
    assert sub.sub.poll(5000)
    frames = sub.sub.recv_multipart()
    assert frames == [b"kv@pod-1@tiny", first.to_bytes(8, "big"), b"".join([
        b"\x93\xcb", bytes.fromhex("3ff8000000000000"), b"\x91",
        b"\x8b", fixstr("type"), fixstr("BlockStored"),
        fixstr("block_hashes"), b"\x92", uint64(vllm_int(a)), uint64(vllm_int(b)),
        fixstr("parent_block_hash"), b"\xc0",
        fixstr("token_ids"), b"\x94\x01\x02\x03\xcd\x01\x2c",
        fixstr("block_size"), b"\x02", fixstr("lora_id"), b"\xc0",
        fixstr("medium"), fixstr("CPU"), fixstr("lora_name"), b"\xc0",
        fixstr("extra_keys"), b"\x92\xc0\xc0", fixstr("group_idx"), b"\x00",
        b"\xb2kv_cache_spec_kind", fixstr("full_attention"),
        b"\x00"])]
    assert sub.sub.poll(5000)
    topic, seq, payload = sub.sub.recv_multipart()
    assert seq == (first + 1).to_bytes(8, "big")  # the empty step took no seq
    assert payload == b"\x93\xcb" + bytes.fromhex("4004000000000000") + b"\x91\x81" + fixstr("type") \
        + fixstr("AllBlocksCleared") + b"\x00"


def test_a_reset_goes_out_with_the_next_step_as_in_vllm(opened):
    """kvscope steps once to hand a reset's events over; vLLM queues AllBlocksCleared until its
    next engine step. So the reset waits for the next step, with or without KV events of its own."""
    from engine.kv_events.decoder import decode_batch

    sub = opened(Subscriber())
    pub = opened(publisher(sub.endpoint))
    connected(pub, sub)
    first = pub.seq
    a = "ab" * 32
    reset = [BlockEvicted(1, 0, a, "reset"), PrefixCacheReset(1)]
    pub.on_step(SimpleNamespace(ts=1.0, events=reset))
    assert pub.flush() and pub.seq == first and not sub.sub.poll(300)  # held
    pub.on_step(SimpleNamespace(ts=2.0, events=[BlockCached(2, 3, a, None, (1, 2))]))
    pub.on_step(SimpleNamespace(ts=3.0, events=reset))
    pub.on_step(SimpleNamespace(ts=4.0, events=[]))  # a step that caches nothing still carries it
    assert pub.flush()
    got = []
    while len(got) < 2 and sub.sub.poll(5000):
        _, seq, payload = sub.sub.recv_multipart()
        got.append((int.from_bytes(seq, "big"), decode_batch(payload)))
    assert [(seq, b.ts, [type(e).__name__ for e in b.events]) for seq, b in got] == [
        (first, 2.0, ["AllBlocksCleared", "BlockStored"]), (first + 1, 4.0, ["AllBlocksCleared"])]


def test_array_encoding_on_the_wire(opened):
    sub = opened(Subscriber("array"))
    pub = opened(publisher(sub.endpoint, encoding="array"))
    connected(pub, sub)
    core = Core(pub)
    for _ in range(30):
        core.step()
    pub.flush()
    sub.wait_for(pub.seq - 1)
    assert sub.hashes == core.truth()


def test_stream_matches_the_pool_step_by_step_and_a_forced_gap_is_replayed(opened):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = opened(Subscriber(replay=replay))
    pub = opened(publisher(sub.endpoint, replay_endpoint=replay))
    sub.drop_live = {3, 4, 9}  # lost on the way: only replay can bring them back
    core = Core(pub, seed=1)
    for _ in range(120):
        core.step()
        assert pub.flush()
        if pub.seq:
            sub.wait_for(pub.seq - 1)
        assert sub.hashes == core.truth(), f"step {core.s.step}"
        for h in sub.hashes:  # and each block's tokens are the engine's
            (b,) = [b for hh, b in core.s.kv.pool.cached.items() if vllm_int(hh) == h]
            assert sub.tokens[h] == b.token_ids
    assert {3, 4, 9} <= set(sub.replayed)
    assert sub.log.count((3, "BlockStored")) + sub.log.count((3, "BlockRemoved")) > 0
    assert any(k == "BlockRemoved" for _, k in sub.log), "the workload should evict"


def test_replay_keeps_buffer_steps_and_ends_with_the_marker(opened):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = opened(Subscriber(replay=replay))
    pub = opened(publisher(sub.endpoint, replay_endpoint=replay, buffer_steps=3, topic="t"))
    for _ in range(6):
        pub.announce_cleared()
    assert pub.flush()
    dealer = opened(zmq.Context.instance().socket(zmq.DEALER))
    dealer.linger = 0
    dealer.connect(replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    got = []
    while True:
        assert dealer.poll(5000)
        got.append(dealer.recv_multipart())
        if got[-1][2] == END:
            break
    assert [g[:3] for g in got] == [[b"", b"t", (i).to_bytes(8, "big")] for i in (3, 4, 5)] + [[b"", b"", END]]
    assert got[-1] == [b"", b"", END, b""]
    # a malformed request (a 2-byte seq) is answered with the end marker alone
    dealer.send_multipart([b"", b"\x00\x01"])
    assert dealer.poll(5000) and dealer.recv_multipart() == [b"", b"", END, b""]
    assert pub.stats()["buffered"] == 3


def test_a_late_joiner_catches_up_through_replay(opened):
    port, replay = free_port(), f"tcp://127.0.0.1:{free_port()}"
    pub = opened(publisher(f"tcp://127.0.0.1:{port}", replay_endpoint=replay))  # nobody listens yet
    core = Core(pub, seed=2)
    for _ in range(40):
        core.step()
    assert pub.flush() and pub.seq > 5
    sub = opened(Subscriber(endpoint=f"tcp://127.0.0.1:{port}", replay=replay))
    for _ in range(40):
        core.step()
    assert pub.flush()
    sub.wait_for(pub.seq - 1)
    assert sub.hashes == core.truth()
    assert 0 in sub.replayed


def test_a_subscriber_that_never_reads_costs_at_most_the_high_water_mark(opened):
    endpoint = f"inproc://kv-{uuid.uuid4().hex}"
    pub = opened(publisher(endpoint, hwm=5, buffer_steps=50))
    sleeper = opened(Subscriber(endpoint=endpoint, bind=False, rcvhwm=5))
    core = Core(pub, seed=3, num_blocks=64)
    for _ in range(300):
        core.step()  # the engine's side: never blocks, whatever the subscriber does
    for _ in range(2000):
        pub.announce_cleared()
    assert pub.flush(30)
    stats = pub.stats()
    assert stats["queued"] == 0 and stats["dropped_steps"] == 0
    assert stats["batches"] > 2000 and stats["buffered"] == 50  # replay memory: buffer_steps batches
    held = sleeper.pump(0.5)  # what ZMQ kept for it: its send + receive high-water marks
    assert 0 < held <= 5 + 5


def test_a_full_queue_drops_the_step_and_skips_its_seq(opened):
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = opened(Subscriber(replay=replay))
    pub = opened(publisher(sub.endpoint, replay_endpoint=replay, max_queue_size=2))
    connected(pub, sub)
    base = pub.seq
    gate, entered = threading.Event(), threading.Event()
    encode = pub._encoder.encode

    def stuck(batch):  # the publisher thread falls behind (a test hook, not a real path)
        entered.set()
        assert gate.wait(10)
        return encode(batch)

    pub._encoder.encode = stuck
    cached = lambda i: SimpleNamespace(ts=1.0, events=[BlockCached(1, i, f"{i:064x}", None, (i,))])
    pub.on_step(cached(1))  # taken by the thread, which now waits
    assert entered.wait(10)
    pub.on_step(cached(2))
    pub.on_step(cached(3))  # the queue (2) is full
    pub.on_step(cached(4))  # dropped: had KV events, so its seq is skipped
    pub.on_step(SimpleNamespace(ts=1.0, events=[]))  # dropped: nothing to skip
    gate.set()
    assert pub.flush()
    pub._encoder.encode = encode
    pub.on_step(cached(5))
    assert pub.flush()
    assert pub.stats()["dropped_steps"] == 2
    seqs = []
    while sub.sub.poll(1000):
        seqs.append(int.from_bytes(sub.sub.recv_multipart()[1], "big"))
    assert seqs == [base, base + 1, base + 2, base + 4]
    # replay cannot bring back what was never sent: the subscriber sees the hole
    sub.next_seq = base + 3
    assert sub.fill(base + 3) == [base + 4]


def test_close_sends_what_is_queued_and_frees_the_endpoint(opened, tmp_path):
    endpoint = f"ipc://{tmp_path}/kv.sock"
    pub = publisher(endpoint)
    sub = opened(Subscriber(endpoint=endpoint, bind=False))
    connected(pub, sub)
    first = pub.seq
    for _ in range(50):
        pub.announce_cleared()
    pub.close()
    pub.close()  # idempotent
    assert not pub._thread.is_alive() and pub.closed
    pub.on_step(SimpleNamespace(ts=1.0, events=[]))  # after close: ignored, no error
    got = []
    while sub.sub.poll(2000):
        got.append(int.from_bytes(sub.sub.recv_multipart()[1], "big"))
    assert got == list(range(first, first + 50))
    opened(publisher(endpoint)).announce_cleared()  # the endpoint is free again


def test_an_endpoint_in_use_is_a_clear_config_error(opened, tmp_path):
    replay = f"tcp://127.0.0.1:{free_port()}"
    opened(publisher(f"ipc://{tmp_path}/a.sock", replay_endpoint=replay))
    with pytest.raises(ConfigError, match=f"cannot bind {replay}: Address already in use"):
        publisher(f"ipc://{tmp_path}/b.sock", replay_endpoint=replay)
    with pytest.raises(ConfigError, match="does not enable a ZMQ publisher"):
        KVEventsPublisher(KVEventsConfig(), "CPU")


def test_fetch_replay_reads_both_reply_layouts(opened):
    from engine.kv_events.decoder import decode_batch
    from engine.kv_events.replay import fetch_replay
    from engine.kv_events.types import AllBlocksCleared

    ctx = zmq.Context.instance()
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = opened(Subscriber())
    pub = opened(publisher(sub.endpoint, replay_endpoint=replay, topic="kv@a"))
    for _ in range(3):
        pub.announce_cleared()
    assert pub.flush()
    dealer = opened(ctx.socket(zmq.DEALER))
    dealer.linger = 0
    dealer.connect(replay)
    frames = fetch_replay(dealer, 1)  # current vLLM's layout: [topic, seq, payload]
    assert [(f.topic, f.seq) for f in frames] == [(b"kv@a", 1), (b"kv@a", 2)]
    assert decode_batch(frames[0].payload).events == (AllBlocksCleared(),)

    # older vLLM and SGLang: [seq, payload], the end marker [END, b""]
    router = opened(ctx.socket(zmq.ROUTER))
    router.linger = 0
    old = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"

    def answer():
        client, _, start = router.recv_multipart()
        n = int.from_bytes(start, "big")
        router.send_multipart([client, b"", n.to_bytes(8, "big"), frames[0].payload])
        router.send_multipart([client, b"", END, b""])

    t = threading.Thread(target=answer)
    t.start()
    old_dealer = opened(ctx.socket(zmq.DEALER))
    old_dealer.linger = 0
    old_dealer.connect(old)
    got = fetch_replay(old_dealer, 7)
    t.join(5)
    assert [(f.topic, f.seq, f.payload) for f in got] == [(None, 7, frames[0].payload)]
    silent = opened(ctx.socket(zmq.DEALER))
    silent.linger = 0
    silent.connect(f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(TimeoutError, match="no replay reply"):
        fetch_replay(silent, 0, timeout=0.2)

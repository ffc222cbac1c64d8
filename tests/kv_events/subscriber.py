"""A KV event subscriber written from the format description alone (pyzmq + msgspec).

It does not import ``engine.kv_events``: it decodes with typed msgspec structs shaped
as vLLM defines them (``vllm/distributed/kv_events.py``), so the tests check kvscope's
publisher against the format, not against itself.

Format: PUB frames ``[topic, seq (8 bytes big-endian), msgpack payload]``; payload
``[ts, events, data_parallel_rank]``; events tagged maps (``"type"``) or tagged arrays.
Replay: DEALER sends ``[b"", start_seq]``, gets ``[b"", topic, seq, payload]`` per batch,
then ``[b"", b"", 0xFF*8, b""]``.
"""

from __future__ import annotations

import time
from typing import Union

import msgspec
import zmq

END = b"\xff" * 8


# ---- current vLLM: events are tagged maps; defaulted fields may be absent --------------------

class _MapEvent(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(_MapEvent):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    extra_keys: Union[list, None] = None
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    kv_cache_spec_sliding_window: Union[int, None] = None
    locality: Union[str, None] = None
    ownership: Union[str, None] = None
    session_id: Union[str, None] = None


class BlockRemoved(_MapEvent):
    block_hashes: list[Union[int, bytes]]
    medium: Union[str, None]
    group_idx: Union[int, None] = None
    locality: Union[str, None] = None
    ownership: Union[str, None] = None


class AllBlocksCleared(_MapEvent):
    pass


class MapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]
    data_parallel_rank: Union[int, None] = None


# ---- vLLM <= 0.23: the same events as tagged arrays (positional; trailing defaults optional) ---

def _as_array(cls):
    fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default)
              for f in msgspec.structs.fields(cls)]
    return msgspec.defstruct(cls.__name__, fields, tag=True, array_like=True, omit_defaults=True)


ArrayBlockStored = _as_array(BlockStored)
ArrayBlockRemoved = _as_array(BlockRemoved)
ArrayAllBlocksCleared = _as_array(AllBlocksCleared)


class ArrayBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Union[ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared]]
    data_parallel_rank: Union[int, None] = None


DECODERS = {"map": msgspec.msgpack.Decoder(MapBatch), "array": msgspec.msgpack.Decoder(ArrayBatch)}


def kind(event) -> str:
    return type(event).__name__


class Subscriber:
    """Receives, fills gaps through replay, and folds the stream into a set of cached hashes."""

    def __init__(self, encoding: str = "map", endpoint: str | None = None, bind: bool = True,
                 replay: str | None = None, topic: bytes = b"", rcvhwm: int | None = None) -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.linger = 0
        if endpoint is None:
            port = self.sub.bind_to_random_port("tcp://127.0.0.1")
            endpoint = f"tcp://127.0.0.1:{port}"
        elif bind:
            self.sub.bind(endpoint)
        else:
            self.sub.connect(endpoint)
        self.endpoint = endpoint
        self.replay_endpoint = replay
        self.decoder = DECODERS[encoding]
        self.next_seq = 0
        self.payloads: dict[int, bytes] = {}  # seq -> payload, as received live or replayed
        self.topics: dict[int, bytes] = {}
        self.batches: dict[int, object] = {}
        self.replayed: list[int] = []  # seqs that came through replay
        self.drop_live: set[int] = set()  # seqs to throw away on receipt (a forced gap)
        self.hashes: set = set()
        self.tokens: dict = {}
        self.parent: dict = {}
        self.log: list[tuple[int, str]] = []  # (seq, event kind) in order

    def close(self) -> None:
        self.sub.close(0)

    # ---- receiving -------------------------------------------------------------------

    def pump(self, timeout: float = 0.0) -> int:
        """Read whatever arrived (waiting up to ``timeout`` for the first); returns how many."""
        n = 0
        while self.sub.poll(int(timeout * 1000) if n == 0 else 0):
            topic, seq_b, payload = self.sub.recv_multipart()
            assert len(seq_b) == 8
            seq = int.from_bytes(seq_b, "big")
            n += 1
            if seq in self.drop_live:
                self.drop_live.discard(seq)
                continue
            self._take(seq, topic, payload)
        return n

    def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Until every batch up to ``seq`` is applied (filling gaps via replay)."""
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while self.next_seq <= seq:
            if self.pump(0.05):
                quiet_since = time.monotonic()
            elif self.replay_endpoint is not None and time.monotonic() - quiet_since > 0.5:
                # lost at the tail (or before the connection was up): nothing later reveals it
                self.fill(self.next_seq)
                quiet_since = time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited for seq {seq}, have up to {self.next_seq - 1}")

    def _take(self, seq: int, topic: bytes, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # already applied (a replay overlapped the live stream)
        if seq > self.next_seq:
            if self.replay_endpoint is None:
                raise AssertionError(f"gap: expected seq {self.next_seq}, got {seq}")
            self.fill(self.next_seq)
            if seq < self.next_seq:
                return
            assert seq == self.next_seq, f"replay could not fill {self.next_seq}..{seq - 1}"
        self._apply(seq, topic, payload)

    def fill(self, start: int) -> list[int]:
        """Ask the replay socket for everything from ``start``; apply what is new."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            got = []
            while True:
                assert dealer.poll(10_000), "no replay reply"
                frames = dealer.recv_multipart()
                assert frames[0] == b"" and len(frames) == 4, frames
                _, topic, seq_b, payload = frames
                if seq_b == END:
                    assert topic == b"" and payload == b""
                    break
                got.append((int.from_bytes(seq_b, "big"), topic, payload))
        finally:
            dealer.close(0)
        seqs = []
        for seq, topic, payload in got:
            seqs.append(seq)
            if seq == self.next_seq:
                self.replayed.append(seq)
                self._apply(seq, topic, payload)
        return seqs

    def _apply(self, seq: int, topic: bytes, payload: bytes) -> None:
        batch = self.decoder.decode(payload)
        self.payloads[seq], self.topics[seq], self.batches[seq] = payload, topic, batch
        for e in batch.events:
            k = kind(e)
            self.log.append((seq, k))
            if k == "BlockStored":
                bs = e.block_size
                assert len(e.token_ids) == bs * len(e.block_hashes)
                prev = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    self.hashes.add(h)
                    self.tokens[h] = tuple(e.token_ids[i * bs:(i + 1) * bs])
                    self.parent[h] = prev
                    prev = h
            elif k == "BlockRemoved":
                for h in e.block_hashes:
                    assert h in self.hashes, f"removed {h} that was never stored"
                    self.hashes.discard(h)
            else:
                self.hashes.clear()
        self.next_seq = seq + 1

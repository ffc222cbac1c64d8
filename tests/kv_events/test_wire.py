"""The wire format, byte for byte, and the decoder on both encodings and both replay layouts."""

import msgspec
import pytest

from engine.kv_events.decoder import (
    Frame, KVEventsDecodeError, decode_batch, decode_seq, parse_live, parse_replay,
)
from engine.kv_events.encoding import END_SEQ, BatchEncoder, seq_bytes
from engine.kv_events.types import (
    AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, UnknownEvent,
)
from tests.kv_events import subscriber as vllm


# msgpack, hand-assembled from the spec (not produced by msgspec)
def fixstr(text: str) -> bytes:
    assert len(text) < 32
    return bytes([0xA0 | len(text)]) + text.encode()


def uint64(x: int) -> bytes:
    return b"\xcf" + x.to_bytes(8, "big")


NIL = b"\xc0"
BIG = 2**64 - 1
BATCH = KVEventBatch(1.5, (
    BlockStored((BIG, 7), None, (1, 2, 3, 300), 2, None, "CPU", None),
    BlockRemoved((7,), "CPU"),
    AllBlocksCleared(),
), 0)
TS = b"\xcb" + bytes.fromhex("3ff8000000000000")  # float64 1.5
TOKENS = b"\x94\x01\x02\x03\xcd\x01\x2c"  # [1, 2, 3, 300]

MAP_BYTES = b"".join([
    b"\x93", TS, b"\x93",
    b"\x88", fixstr("type"), fixstr("BlockStored"),
    fixstr("block_hashes"), b"\x92", uint64(BIG), b"\x07",
    fixstr("parent_block_hash"), NIL,
    fixstr("token_ids"), TOKENS,
    fixstr("block_size"), b"\x02",
    fixstr("lora_id"), NIL,
    fixstr("medium"), fixstr("CPU"),
    fixstr("lora_name"), NIL,
    b"\x83", fixstr("type"), fixstr("BlockRemoved"), fixstr("block_hashes"), b"\x91\x07",
    fixstr("medium"), fixstr("CPU"),
    b"\x81", fixstr("type"), fixstr("AllBlocksCleared"),
    b"\x00",  # data_parallel_rank
])
ARRAY_BYTES = b"".join([
    b"\x93", TS, b"\x93",
    b"\x98", fixstr("BlockStored"), b"\x92", uint64(BIG), b"\x07", NIL, TOKENS, b"\x02", NIL,
    fixstr("CPU"), NIL,
    b"\x93", fixstr("BlockRemoved"), b"\x91\x07", fixstr("CPU"),
    b"\x91", fixstr("AllBlocksCleared"),
    b"\x00",
])


def test_map_encoding_is_byte_exact():
    assert BatchEncoder("map").encode(BATCH) == MAP_BYTES


def test_array_encoding_is_byte_exact():
    assert BatchEncoder("array").encode(BATCH) == ARRAY_BYTES


def test_seq_frames():
    assert seq_bytes(0) == b"\x00" * 8
    assert seq_bytes(1) == b"\x00" * 7 + b"\x01"
    assert seq_bytes(258) == b"\x00" * 6 + b"\x01\x02"
    assert END_SEQ == b"\xff" * 8
    assert decode_seq(END_SEQ) == -1 and decode_seq(seq_bytes(258)) == 258
    with pytest.raises(KVEventsDecodeError, match="8 bytes"):
        decode_seq(b"\x00\x01")


def test_vllms_typed_decoders_read_both_encodings():
    """vLLM's own struct shapes (current map, <= 0.23 array) decode what kvscope sends."""
    m = vllm.DECODERS["map"].decode(MAP_BYTES)
    assert (m.ts, m.data_parallel_rank) == (1.5, 0)
    stored, removed, cleared = m.events
    assert isinstance(stored, vllm.BlockStored) and stored.block_hashes == [BIG, 7]
    assert stored.token_ids == [1, 2, 3, 300] and stored.block_size == 2 and stored.medium == "CPU"
    assert stored.group_idx is None and stored.extra_keys is None  # defaults, omitted on the wire
    assert isinstance(removed, vllm.BlockRemoved) and removed.block_hashes == [7]
    assert isinstance(cleared, vllm.AllBlocksCleared)
    a = vllm.DECODERS["array"].decode(ARRAY_BYTES)
    assert [vllm.kind(e) for e in a.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert a.events[0].block_hashes == [BIG, 7] and a.events[0].lora_name is None


def test_sglangs_older_array_decoder_reads_the_array_encoding():
    """SGLang's first structs had 5 BlockStored fields and no medium: extras are ignored."""

    class Ev(msgspec.Struct, array_like=True, tag=True):
        pass

    class BlockStored5(Ev, tag="BlockStored"):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None

    class BlockRemoved1(Ev, tag="BlockRemoved"):
        block_hashes: list[int]

    class Cleared(Ev, tag="AllBlocksCleared"):
        pass

    class Batch(msgspec.Struct, array_like=True):
        ts: float
        events: list[BlockStored5 | BlockRemoved1 | Cleared]

    b = msgspec.msgpack.decode(ARRAY_BYTES, type=Batch)
    assert b.events[0].token_ids == [1, 2, 3, 300] and b.events[1].block_hashes == [7]


@pytest.mark.parametrize("payload", [MAP_BYTES, ARRAY_BYTES])
def test_decoder_reads_both_encodings(payload):
    assert decode_batch(payload) == BATCH


def test_decoder_ignores_unknown_fields_and_takes_bytes_hashes():
    digest = bytes(range(32))
    current_vllm = msgspec.msgpack.encode([2.0, [
        {"type": "BlockStored", "block_hashes": [digest], "parent_block_hash": b"\x01" * 32,
         "token_ids": [5, 6], "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None,
         "extra_keys": [None], "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "LOCAL"},
        {"type": "BlockRemoved", "block_hashes": [-3], "medium": "GPU", "group_idx": 0},
        {"type": "BlockPinned", "block_hashes": [1]},
    ], 1])
    b = decode_batch(current_vllm)
    assert b.data_parallel_rank == 1
    assert b.events == (BlockStored((digest,), b"\x01" * 32, (5, 6), 2, None, "GPU", None),
                        BlockRemoved((-3,), "GPU"), UnknownEvent("BlockPinned"))
    sglang_old = msgspec.msgpack.encode([3.0, [["BlockStored", [9], None, [1, 2], 2, None],
                                               ["BlockRemoved", [9]], ["AllBlocksCleared"]]])
    b = decode_batch(sglang_old)
    assert b.data_parallel_rank is None  # [ts, events]: no rank
    assert b.events == (BlockStored((9,), None, (1, 2), 2), BlockRemoved((9,)), AllBlocksCleared())
    future_array = msgspec.msgpack.encode([3.0, [["BlockStored", [9], None, [1, 2], 2, None, "GPU", None,
                                                  [None], 0, "full_attention"]], 0])
    assert decode_batch(future_array).events[0].medium == "GPU"


@pytest.mark.parametrize("payload, match", [
    (b"\xc1", "not msgpack"),
    (msgspec.msgpack.encode(5), "a batch is an array"),
    (msgspec.msgpack.encode(["x", []]), "ts must be a number"),
    (msgspec.msgpack.encode([1.0, {}]), "events must be an array"),
    (msgspec.msgpack.encode([1.0, [5]]), "tagged map or a tagged array"),
    (msgspec.msgpack.encode([1.0, [{"type": 3}]]), "tag must be a string"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": ["a"]}]]), "int or bytes"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1],
                                     "parent_block_hash": None}]]), "block_size must be an integer"),
    (msgspec.msgpack.encode([1.0, [], "zero"]), "data_parallel_rank must be an integer"),
])
def test_decoder_errors_are_clear(payload, match):
    with pytest.raises(KVEventsDecodeError, match=match):
        decode_batch(payload)


def test_frames_live_and_both_replay_layouts():
    assert parse_live([b"kv", seq_bytes(4), b"p"]) == Frame(b"kv", 4, b"p")
    assert parse_replay([b"kv", seq_bytes(4), b"p"]) == Frame(b"kv", 4, b"p")  # current vLLM
    assert parse_replay([seq_bytes(4), b"p"]) == Frame(None, 4, b"p")  # older vLLM, SGLang
    assert parse_replay([b"", END_SEQ, b""]).is_end and parse_replay([END_SEQ, b""]).is_end
    with pytest.raises(KVEventsDecodeError, match="3 frames"):
        parse_live([seq_bytes(1), b"p"])
    with pytest.raises(KVEventsDecodeError, match="2 or 3 frames"):
        parse_replay([b"p"])

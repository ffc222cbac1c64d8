"""kvscope's events → vLLM's, on the core alone: after every step the stored-minus-removed
hashes are exactly the block pool's cached blocks, with their tokens and parents."""

import dataclasses
import hashlib
import random

import pytest

from engine.core.hashing import hash_full_blocks
from engine.events.schema.types import BlockAllocated, BlockCached, BlockEvicted, PrefixCacheReset
from engine.kv_events.mapping import to_kv_events, vllm_block_hash
from engine.kv_events.types import AllBlocksCleared, BlockRemoved, BlockStored
from tests.core.driver import make_scheduler, req, step


def vllm_int(hex_digest: str) -> int:
    """vLLM's maybe_convert_block_hash, written out: the digest as a big-endian int, low 64 bits."""
    return int.from_bytes(bytes.fromhex(hex_digest), "big") & ((1 << 64) - 1)


class Mirror:
    """What a consumer of vLLM's stream knows: cached hash -> (tokens, parent)."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[tuple[int, ...], int | None]] = {}
        self.kinds: list[str] = []
        self.stored_sizes: list[int] = []

    def fold(self, events) -> None:
        for e in events:
            self.kinds.append(type(e).__name__)
            if isinstance(e, BlockStored):
                self.stored_sizes.append(len(e.block_hashes))
                assert len(e.token_ids) == e.block_size * len(e.block_hashes)
                assert (e.medium, e.group_idx, e.kv_cache_spec_kind, e.lora_id, e.lora_name) == ("GPU", 0, "full_attention", None, None)
                assert e.extra_keys == (None,) * len(e.block_hashes)
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    assert h not in self.blocks, "stored twice without a removal"
                    self.blocks[h] = (tuple(e.token_ids[i * e.block_size:(i + 1) * e.block_size]), parent)
                    parent = h
            elif isinstance(e, BlockRemoved):
                assert (e.medium, e.group_idx) == ("GPU", 0)
                for h in e.block_hashes:
                    del self.blocks[h]  # KeyError: removed a hash the stream never stored
            else:
                assert isinstance(e, AllBlocksCleared)
                self.blocks.clear()


def truth(s) -> dict[int, tuple[tuple[int, ...], int | None]]:
    """The engine's cached blocks in the stream's terms."""
    return {vllm_int(h): (b.token_ids, None if b.parent_hash is None else vllm_int(b.parent_hash))
            for h, b in s.kv.pool.cached.items()}


def fold_step(s, mirror: Mirror) -> list:
    kv = to_kv_events(s.log.drain())
    mirror.fold(kv)
    assert mirror.blocks == truth(s), f"drift after step {s.step}"
    return kv


def test_int_hash_is_vllms_low_64_bits_of_the_digest():
    for text in ("a", "kvscope", "x" * 100):
        digest = hashlib.sha256(text.encode()).digest()
        assert vllm_block_hash(digest.hex()) == int.from_bytes(digest, "big") % 2**64
        assert vllm_block_hash(digest.hex()) == int.from_bytes(digest[-8:], "big")


def test_stream_tracks_the_pool_step_by_step_under_cache_pressure():
    s = make_scheduler(block_size=4, num_blocks=24, max_model_len=48, budget=16, max_num_seqs=4)
    rng = random.Random(3)
    mirror = Mirror()
    system = list(range(100, 111))  # 11 shared tokens: 2 full blocks
    arrived = 0
    for _ in range(400):
        if arrived < 30 and rng.random() < 0.5:
            prompt = (system if rng.random() < 0.6 else []) + [rng.randrange(3, 90) for _ in range(rng.randrange(2, 14))]
            s.add_request(req(f"r{arrived}", prompt, max_tokens=rng.randrange(1, 9)))
            arrived += 1
        if not s.has_unfinished_requests():
            if arrived >= 30:
                break
            continue
        step(s)
        fold_step(s, mirror)
    assert arrived == 30 and not s.has_unfinished_requests()
    assert mirror.kinds.count("BlockRemoved") > 10, "the workload should evict"
    assert max(mirror.stored_sizes) >= 3, "a prefill's full blocks go out as one BlockStored"
    assert s.log.counts.num_evictions == mirror.kinds.count("BlockRemoved")  # reuse evictions only


def test_one_allocation_is_one_stored_event_chained_to_the_hit_before_it():
    s = make_scheduler(block_size=4, num_blocks=16, max_model_len=32)
    mirror = Mirror()
    s.add_request(req("a", range(10, 23), max_tokens=1))  # 13 tokens: 3 full blocks
    step(s)
    (first,) = fold_step(s, mirror)
    a_hashes = hash_full_blocks(list(range(10, 23)), 4, [])
    assert first.block_hashes == tuple(vllm_int(h) for h in a_hashes)
    assert first.parent_block_hash is None and first.block_size == 4
    assert first.token_ids == tuple(range(10, 22))
    # b hits a's first two blocks and fills two more of its own
    s.add_request(req("b", list(range(10, 18)) + [50, 51, 52, 53, 54, 55, 56, 57, 58], max_tokens=1))
    step(s)
    (second,) = fold_step(s, mirror)
    assert second.parent_block_hash == vllm_int(a_hashes[1])
    assert second.token_ids == (50, 51, 52, 53, 54, 55, 56, 57)
    assert len(second.block_hashes) == 2


def test_reset_is_all_blocks_cleared_and_no_removed_events():
    s = make_scheduler(block_size=4, num_blocks=16, max_model_len=32)
    mirror = Mirror()
    s.add_request(req("a", range(12), max_tokens=1))
    s.add_request(req("live", range(40, 53), max_tokens=20))  # keeps its blocks in use
    step(s)
    step(s)
    fold_step(s, mirror)
    assert len(mirror.blocks) == 6
    assert s.kv.reset_prefix_cache() == 6
    kv = fold_step(s, mirror)
    assert kv == [AllBlocksCleared()]
    assert mirror.blocks == {} == truth(s)
    step(s)  # the cache fills again afterwards
    fold_step(s, mirror)


def test_failed_forward_rollback_is_removed_after_stored():
    s = make_scheduler(block_size=4, num_blocks=16, max_model_len=32)
    mirror = Mirror()
    s.add_request(req("a", range(10, 15), max_tokens=1))
    step(s)
    fold_step(s, mirror)
    s.add_request(req("b", range(20, 30), max_tokens=1))
    s.schedule()  # hashes b's two full blocks... and the forward fails
    assert s.kv.uncache_uncomputed() == 2
    kv = fold_step(s, mirror)
    assert [type(e).__name__ for e in kv] == ["BlockStored", "BlockRemoved", "BlockRemoved"]
    assert {h for e in kv[1:] for h in e.block_hashes} == set(kv[0].block_hashes)


# ---- block_evicted.reason, when the event carries it -------------------------------------

_HAS_REASON = "reason" in {f.name for f in dataclasses.fields(BlockEvicted)}


@dataclasses.dataclass(frozen=True, slots=True)
class _EvictedWithReason(BlockEvicted):
    reason: str = "reuse"


def evicted(block: int, h: str, reason: str | None):
    """A block_evicted with ``reason``, or one without (as today, or an old recording)."""
    if reason is None:
        return _OldEvicted(1, block, h, reason="reuse") if _HAS_REASON else BlockEvicted(1, block, h)
    return BlockEvicted(1, block, h, reason=reason) if _HAS_REASON else _EvictedWithReason(1, block, h, reason)


@dataclasses.dataclass(frozen=True, slots=True)
class _OldEvicted(BlockEvicted):
    """Subclass that hides ``reason`` (getattr falls back to None)."""

    def __post_init__(self) -> None:
        pass

    def __getattribute__(self, name):
        if name == "reason":
            raise AttributeError(name)
        return object.__getattribute__(self, name)


H = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(8)]


def _cached(i: int, parent: int | None) -> BlockCached:
    return BlockCached(1, i, H[i], None if parent is None else H[parent], (i, i, i, i))


@pytest.mark.parametrize("with_reason", [True, False])
def test_reuse_rollback_and_reset_evictions_map_with_or_without_reason(with_reason):
    r = (lambda x: x) if with_reason else (lambda x: None)
    events = [
        _cached(0, None), _cached(1, 0), _cached(2, 1),           # one allocation: one BlockStored
        evicted(5, H[5], r("reuse")), BlockAllocated(1, 5, "q", 0),  # reuse: the block is then allocated
        _cached(3, 2),
        evicted(3, H[3], r("rollback")), evicted(2, H[2], r("rollback")),
        BlockAllocated(1, 6, "q", 1),
        evicted(0, H[0], r("reset")), evicted(1, H[1], r("reset")), PrefixCacheReset(1),
    ]
    assert to_kv_events(events) == [  # vLLM 0.32's fields: medium GPU, group 0, full attention
        BlockStored((vllm_int(H[0]), vllm_int(H[1]), vllm_int(H[2])), None, (0,) * 4 + (1,) * 4 + (2,) * 4,
                    4, None, "GPU", None, (None,) * 3, 0, "full_attention"),
        BlockRemoved((vllm_int(H[5]),), "GPU", 0),
        BlockStored((vllm_int(H[3]),), vllm_int(H[2]), (3, 3, 3, 3), 4, None, "GPU", None, (None,), 0,
                    "full_attention"),
        BlockRemoved((vllm_int(H[3]),), "GPU", 0),
        BlockRemoved((vllm_int(H[2]),), "GPU", 0),
        AllBlocksCleared(),
    ]


def test_with_reason_a_rollback_right_before_a_reset_is_still_removed():
    events = [evicted(4, H[4], "rollback"), evicted(0, H[0], "reset"), PrefixCacheReset(1)]
    assert to_kv_events(events, None) == [BlockRemoved((vllm_int(H[4]),), None, 0), AllBlocksCleared()]
    # a reset eviction is never a removal, even without its reset event in the same list
    assert to_kv_events([evicted(0, H[0], "reset")], None) == []


def test_consecutive_blocks_of_different_chains_are_separate_events():
    events = [_cached(0, None), _cached(1, 0), _cached(4, None), _cached(5, 4)]
    kv = to_kv_events(events, None)
    assert [e.block_hashes for e in kv] == [(vllm_int(H[0]), vllm_int(H[1])), (vllm_int(H[4]), vllm_int(H[5]))]
    assert [e.parent_block_hash for e in kv] == [None, None]

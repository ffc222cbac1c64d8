"""Our paged forward pass against transformers' logits on tiny random models (fp32).

Every row of every step is compared with the reference logits at the same absolute
position of the full sequence, so prefill chunks, cached prefixes and decodes are all
checked in place.
"""

from __future__ import annotations

import pytest
import torch

from engine.model import TorchAttentionBackend, allocate_kv_caches
from tests.model.paged_batch import PagedBatchBuilder
from tests.model.refs import reference_logits, tiny_pair
from tests.tiny_models import KINDS, VOCAB_SIZE

ATOL = 1e-4


def _tokens(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()


def _run(kind: str, block_size: int, steps: list[list[tuple[str, int]]], prompts: dict[str, list[int]]):
    """Run steps of (sequence id, chunk length); check each row against the reference."""
    ours, ref = tiny_pair(kind)
    spec = ours.spec
    num_blocks = 64 // block_size * 4
    caches = allocate_kv_caches(spec.num_layers, num_blocks, block_size, spec.num_kv_heads,
                                spec.head_dim, torch.float32, "cpu")
    builder = PagedBatchBuilder(num_blocks, block_size, seed=block_size)
    expected = {sid: reference_logits(ref, toks) for sid, toks in prompts.items()}
    done = {sid: 0 for sid in prompts}
    backend = TorchAttentionBackend()
    for step in steps:
        chunks = []
        for sid, n in step:
            chunks.append((sid, prompts[sid][done[sid]:done[sid] + n]))
        input_ids, positions, meta, rows = builder.step(chunks)
        logits = ours.model.compute_logits(ours.model(input_ids, positions, meta, caches, backend))
        for (sid, n), r in zip(step, rows):
            want = expected[sid][done[sid]:done[sid] + n]
            torch.testing.assert_close(logits[r.start:r.stop], want, atol=ATOL, rtol=1e-4)
            done[sid] += n


@pytest.mark.parametrize("kind", KINDS)
def test_full_prefill(kind):
    _run(kind, 4, [[("a", 13)]], {"a": _tokens(13, 1)})


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_odd_chunks(kind, block_size):
    # 3 + 5 + 3 + 5 + 3 = 19 tokens: chunk edges fall inside blocks and on them.
    steps = [[("a", n)] for n in (3, 5, 3, 5, 3)]
    _run(kind, block_size, steps, {"a": _tokens(19, 2)})


@pytest.mark.parametrize("kind", KINDS)
def test_decode_after_cached_prefix(kind):
    steps = [[("a", 10)]] + [[("a", 1)] for _ in range(6)]
    _run(kind, 4, steps, {"a": _tokens(16, 3)})


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_mixed_batch(kind, block_size):
    # Step 2 holds a prefill continuing after a cached prefix (a: 3 cached + 5 new),
    # a fresh prefill (b: 3), and a decode (c: 9 cached + 1 new).
    prompts = {"a": _tokens(8, 4), "b": _tokens(3, 5), "c": _tokens(10, 6)}
    steps = [[("a", 3), ("c", 9)], [("a", 5), ("b", 3), ("c", 1)]]
    _run(kind, block_size, steps, prompts)


def test_padding_slots_are_not_written():
    # slot -1 marks padding: its K/V must not land anywhere in the cache.
    ours, _ = tiny_pair("llama")
    spec = ours.spec
    caches = allocate_kv_caches(spec.num_layers, 4, 4, spec.num_kv_heads, spec.head_dim,
                                torch.float32, "cpu")
    input_ids, positions, meta, _ = PagedBatchBuilder(4, 4).step([("a", _tokens(3, 7))])
    meta = type(meta)(**{**{f: getattr(meta, f) for f in meta.__dataclass_fields__},
                         "slot_mapping": torch.tensor([-1, -1, -1])})
    ours.model(input_ids, positions, meta, caches, TorchAttentionBackend())
    assert all(float(k.abs().sum()) == 0 and float(v.abs().sum()) == 0 for k, v in caches)

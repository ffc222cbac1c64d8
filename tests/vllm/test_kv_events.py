"""The KV event streams of a real vLLM 0.32 and of kvscope serve, batch for batch.

Same requests to each server alone (vLLM first): the prompts of test_kv_event_hashes.py, then
``/reset_prefix_cache`` and the first prompt again. Measured (2026-12-03): vLLM sends 8 batches,
kvscope 7, and every kvscope payload equals vLLM's byte for byte after the batch's ``ts``
(its first 10 bytes): the same events, hashes, parents, token ids, block size and fields
(medium "GPU", group_idx 0, kv_cache_spec_kind "full_attention", one null extra key a block),
the reset's AllBlocksCleared in the same batch as the next step's BlockStored.

The one difference is vLLM v1's recomputed copies: a request that recomputes a block already
cached (here the third request, the first one's prompt again: its hit stops at the prompt's
full blocks, and decoding fills the next block with the tokens the first request cached) gets
a second physical block under the same hash, and vLLM sends BlockStored for it again. kvscope
keeps one block per hash (vLLM v0's rule; ``engine.core.block_pool.cache``), so it sends
nothing for it: vLLM's stream with its re-stores taken out (a BlockStored split where one sat
inside it, each part's parent the block before it) is kvscope's. Eviction timing differs too
once copies exist (vLLM evicts each copy on its own), so this workload has no evictions.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from engine.kv_events.decoder import decode_batch
from engine.kv_events.encoding import BatchEncoder
from engine.kv_events.types import BlockRemoved, BlockStored, KVEventBatch
from tests.vllm.kv_stream import RawStream, kvscope_with_events
from bench.vllm_servers import MODEL_NAME
from tests.vllm.test_kv_event_hashes import MAX_TOKENS, PROMPTS

pytestmark = pytest.mark.vllm

TS_BYTES = 10  # a payload starts [ts, ...: 0x93, then 0xcb and the float64


def _run(server) -> list[bytes]:
    from openai import OpenAI

    client = OpenAI(base_url=server.api_url, api_key="unused", timeout=300)
    stream = RawStream(server.events_endpoint)
    try:
        stream.join(server, client)

        def complete(prompt: str) -> None:
            client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"ignore_eos": True})
            stream.pump(0.2)

        for p in PROMPTS:
            complete(p)
        stream.settle()
        assert server.reset_prefix_cache() == 200
        complete(PROMPTS[0])
        stream.settle()
        return stream.payloads
    finally:
        stream.close()


@pytest.fixture(scope="module")
def vllm_payloads(vllm_server) -> list[bytes]:
    return _run(vllm_server)


@pytest.fixture(scope="module")
def kvscope_payloads(vllm_payloads, kvscope_servers, tmp_path_factory) -> list[bytes]:
    return _run(kvscope_with_events(kvscope_servers, tmp_path_factory))  # vLLM done: one busy at a time


def without_recomputed_copies(batches: list[KVEventBatch]) -> tuple[list[KVEventBatch], int]:
    """vLLM's batches with every BlockStored block of a hash already held taken out (an event
    split around it, empty events and batches dropped); and how many were taken out."""
    held: Counter = Counter()
    out, copies = [], 0
    for b in batches:
        events = []
        for e in b.events:
            if isinstance(e, BlockRemoved):  # not in this workload: see the module docstring
                raise AssertionError(f"the workload evicted {e.block_hashes}")
            if not isinstance(e, BlockStored):
                if type(e).__name__ == "AllBlocksCleared":
                    held.clear()
                events.append(e)
                continue
            run: list[int] = []
            parent = prev = e.parent_block_hash

            def flush() -> None:
                if run:
                    bs = e.block_size
                    events.append(dataclasses.replace(
                        e, block_hashes=tuple(e.block_hashes[i] for i in run), parent_block_hash=parent,
                        token_ids=tuple(t for i in run for t in e.token_ids[i * bs:(i + 1) * bs]),
                        extra_keys=tuple(e.extra_keys[i] for i in run)))
                    run.clear()

            for i, h in enumerate(e.block_hashes):
                if held[h]:
                    copies += 1
                    flush()
                else:
                    if not run:
                        parent = prev
                    run.append(i)
                held[h] += 1
                prev = h
            flush()
        if events:
            out.append(dataclasses.replace(b, events=tuple(events)))
    return out, copies


def test_kvscope_sends_vllms_batches_byte_for_byte_less_its_recomputed_copies(vllm_payloads, kvscope_payloads):
    v = [decode_batch(p) for p in vllm_payloads]
    expected, copies = without_recomputed_copies(v)
    # the third request's decode-filled block: the first request's 7th block, recomputed
    assert copies == 1, f"{copies} recomputed copies in vLLM's stream"
    kinds = {name: [[type(e).__name__ for e in decode_batch(p).events] for p in payloads]
             for name, payloads in (("vLLM", vllm_payloads), ("kvscope", kvscope_payloads))}
    assert len(vllm_payloads) == len(kvscope_payloads) + 1 == 8, kinds
    assert all(p[:2] == b"\x93\xcb" for p in vllm_payloads + kvscope_payloads)
    enc = BatchEncoder("map")
    assert [enc.encode(b)[TS_BYTES:] for b in expected] == [p[TS_BYTES:] for p in kvscope_payloads]
    # the reset's AllBlocksCleared went out with the next step's stores, in both
    assert kinds["kvscope"][-2] == kinds["vLLM"][-2] == ["AllBlocksCleared", "BlockStored"], kinds
    stored = sum(len(e.block_hashes) for b in v for e in b.events if isinstance(e, BlockStored))
    print(f"\nKV events: vLLM {len(vllm_payloads)} batches ({stored} blocks stored, {copies} a recomputed "
          f"copy), kvscope {len(kvscope_payloads)}: byte-equal after ts once vLLM's copies are out")

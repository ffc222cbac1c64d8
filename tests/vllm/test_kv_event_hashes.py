"""Block hashes on the wire: a real vLLM's KV events against kvscope's hashing.

vLLM (sha256, its default, PYTHONHASHSEED unset) publishes ``BlockStored`` for each block it
caches. ``engine.core.hashing.BlockHasher("sha256")`` over the request's token ids must
give exactly those hashes (as vLLM converts them for events: the digest's low 64 bits),
with the same parents and token ids. Then kvscope serve, hashing with the same algorithm,
must publish the same (hash, parent, tokens) for the same requests.

Each server gets the whole workload alone: vLLM first, then kvscope.
"""

from __future__ import annotations


import msgspec
import pytest

from engine.core.hashing import DEFAULT_HASH_ALGO, BlockHasher
from engine.kv_events.mapping import vllm_block_hash
from tests.kv_events.subscriber import DECODERS, kind
from tests.vllm.kv_stream import RawStream, kvscope_with_events
from bench.vllm_servers import BLOCK_SIZE, MODEL_NAME

pytestmark = pytest.mark.vllm

SHARED = ("A paged KV cache splits each sequence's keys and values into fixed-size blocks. "
          "A block table maps logical blocks to physical ones, and full blocks are hashed so "
          "that a later request with the same prefix can reuse them. ") * 4
PROMPTS = [SHARED + "Question one: what is a block?", SHARED + "Question two: what is a hash?",
           SHARED + "Question one: what is a block?", "A short prompt without a shared prefix at all, "
           "long enough to fill one block of thirty-two tokens, or perhaps two of them."]
MAX_TOKENS = 40  # generated tokens fill blocks too: those are hashed and stored as well


class Events(RawStream):
    """A SUB socket connected to a server's KV events; collects every BlockStored block."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.decoder = DECODERS["map"]
        self.blocks: list[tuple[int, int | None, tuple[int, ...], int]] = []  # hash, parent, tokens, size
        self.kinds: list[str] = []

    def pump(self, timeout: float) -> int:
        n = super().pump(timeout)
        for _, payload in self.frames[len(self.frames) - n:]:
            for e in self.decoder.decode(payload).events:
                self.kinds.append(kind(e))
                if kind(e) == "BlockStored":
                    prev, bs = e.parent_block_hash, e.block_size
                    for i, h in enumerate(e.block_hashes):
                        self.blocks.append((h, prev, tuple(e.token_ids[i * bs:(i + 1) * bs]), bs))
                        prev = h
        return n


def _run(server) -> tuple[Events, list[list[int]]]:
    from openai import OpenAI

    events = Events(server.events_endpoint)
    try:
        client = OpenAI(base_url=server.api_url, api_key="unused", timeout=300)
        events.join(server, client)  # tests/vllm/kv_stream.py: the slow joiner
        events.blocks.clear()
        sequences = []
        for p in PROMPTS:
            r = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
            c = r.choices[0]
            sequences.append(list(getattr(c, "prompt_token_ids", None) or []) + list(getattr(c, "token_ids", None) or []))
        events.settle()
    finally:
        events.close()
    return events, sequences


def _expected(sequences: list[list[int]]) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """Every full block of every sequence: vLLM's event hash -> (parent's, its tokens)."""
    hasher = BlockHasher("sha256")
    out = {}
    for seq in sequences:
        hexes = hasher.full_blocks(seq, BLOCK_SIZE, [])
        for i, h in enumerate(hexes):
            parent = vllm_block_hash(hexes[i - 1]) if i else None
            out[vllm_block_hash(h)] = (parent, tuple(seq[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]))
    return out


@pytest.fixture(scope="module")
def vllm_run(vllm_server):
    return _run(vllm_server)


def test_vllm_block_hashes_are_kvscopes_sha256(vllm_run):
    events, sequences = vllm_run
    assert all(sequences), "vLLM returned no token ids"
    expected = _expected(sequences)
    stored = {(h, p, t) for h, p, t, _ in events.blocks}
    assert stored, "vLLM sent no BlockStored"
    assert {bs for *_, bs in events.blocks} == {BLOCK_SIZE}
    unknown = [(h, p, t) for h, p, t in stored if expected.get(h) != (p, t)]
    assert not unknown, f"{len(unknown)} of {len(stored)} stored blocks are not kvscope's sha256 of their tokens"
    # every full block of every prompt was computed, so stored (the last token's block aside)
    prompt_blocks = set()
    for seq, text in zip(sequences, PROMPTS):
        n_prompt = len(seq) - MAX_TOKENS
        hexes = BlockHasher("sha256").full_blocks(seq[:n_prompt], BLOCK_SIZE, [])
        prompt_blocks |= {vllm_block_hash(h) for h in hexes}
    assert prompt_blocks <= {h for h, *_ in stored}
    print(f"\nvLLM: {len(events.blocks)} blocks stored ({len(stored)} distinct), all equal to "
          f"kvscope's sha256 of their token ids")


@pytest.fixture(scope="module")
def kvscope_run(vllm_run, kvscope_servers, tmp_path_factory):  # vLLM done: one busy at a time
    return _run(kvscope_with_events(kvscope_servers, tmp_path_factory))


@pytest.mark.skipif(DEFAULT_HASH_ALGO != "sha256",
                    reason=f"kvscope serve hashes with {DEFAULT_HASH_ALGO!r} (engine.core.hashing's "
                           "default; serve has no --prefix-caching-hash-algo yet)")
def test_kvscope_serve_publishes_vllms_hashes(vllm_run, kvscope_run):
    (v, v_seqs), (k, k_seqs) = vllm_run, kvscope_run
    v_stored = {(h, p, t) for h, p, t, _ in v.blocks}
    k_stored = {(h, p, t) for h, p, t, _ in k.blocks}
    assert k_stored == v_stored, (f"vLLM stored {len(v_stored)} blocks, kvscope {len(k_stored)}; "
                                  f"{len(v_stored & k_stored)} equal")
    print(f"\nKV events: vLLM {len(v.blocks)} BlockStored blocks, kvscope {len(k.blocks)}; "
          f"the same {len(v_stored)} distinct (hash, parent, tokens)")

"""The trace readers: JSONL, Mooncake's format (hash ids made into tokens), errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.simulate.mooncake import Shape, calibrate, generate, stats
from engine.simulate.trace import (
    MOONCAKE_BLOCK, SYNTHETIC_VOCAB, TraceError, mix, mooncake_tokens, placeholder_token,
    read_jsonl, read_mooncake,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "traces" / "mooncake_conversation_300.jsonl"


def _write(tmp_path, lines) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


def test_mooncake_equal_hash_ids_give_equal_tokens_and_the_core_hashes_share_them():
    from engine.core.hashing import get_hasher

    a = mooncake_tokens([7, 8, 9], 1300)
    b = mooncake_tokens([7, 8, 10], 1100)
    assert len(a) == 1300 and len(b) == 1100
    assert a[:1024] == b[:1024] and a[1024:1100] != b[1024:1100]
    assert a[:512] == [1 + mix(7, i) % 31999 for i in range(512)]  # the stated mapping
    h = get_hasher("sha256")
    ha, hb = h.full_blocks(a, 16, []), h.full_blocks(b, 16, [])
    assert ha[:64] == hb[:64] and ha[64] != hb[64]  # 2 x 512 tokens shared = 64 blocks of 16


@pytest.mark.parametrize("block_size", [16, 32, 48])
def test_prompt_hashes_remembered_by_hash_id_are_the_core_s_hashes(block_size):
    """The simulator hashes each Mooncake block's sub-blocks once per (hash before, hash
    id): on the shipped trace (shared system prompts, re-sent histories) every prompt's
    hashes equal the core's own, with most of them remembered rather than hashed."""
    from engine.core.hashing import get_hasher
    from engine.simulate.prompt_hashes import PromptHashes

    h = get_hasher("sha256")
    ph = PromptHashes(h, block_size, max_entries=64)
    for tr in read_mooncake(SHIPPED).requests[:120]:
        tokens = tr.tokens()
        assert ph(tr, tokens) == tuple(h.full_blocks(tokens, block_size, [])[:(len(tokens) - 1) // block_size])
    if MOONCAKE_BLOCK % block_size == 0:
        assert ph.num_reused > 1000
    assert len(ph._blocks) <= 64


def test_no_two_requests_of_a_trace_share_a_placeholder():
    """``placeholder_token``: one synthetic token id per request index, distinct for
    31,999 requests in a row (a trace under 32,000 requests: no two alike)."""
    toks = [placeholder_token(i) for i in range(SYNTHETIC_VOCAB - 1)]
    assert len(set(toks)) == SYNTHETIC_VOCAB - 1
    assert all(isinstance(t, int) and 1 <= t < SYNTHETIC_VOCAB for t in toks)
    assert placeholder_token(SYNTHETIC_VOCAB - 1) == placeholder_token(0)


def test_a_pod_samples_the_trace_s_tokens_then_its_placeholder_one_object_per_token_id():
    """What a simulated pod samples (``pod._samples``): a Mooncake request's placeholder
    at every position (no stream to advance), and an engine trace's recorded tokens (its
    output length + 1 at most) then its placeholder; the same SampledToken for the same id."""
    from itertools import islice

    from engine.simulate.pod import _SAMPLED, _samples
    from engine.simulate.trace import TracedRequest

    moon = TracedRequest("m", 0.0, None, 5, hash_ids=(1,), num_prompt_tokens=20)
    first, later = _samples(moon, 42)
    assert (first.token_id, later) == (placeholder_token(42), None)
    assert first is _SAMPLED[first.token_id]
    recorded = TracedRequest("e", 0.0, (1, 2, 3), 1, output_token_ids=(7, 8, 40_000))
    first, later = _samples(recorded, 3)
    got = [first] + list(islice(later, 4))
    assert [s.token_id for s in got] == [7, 8] + [placeholder_token(3)] * 3  # 40,000: past length + 1
    assert all(s is _SAMPLED[s.token_id] for s in got)


def test_two_requests_with_one_prompt_store_their_output_blocks_apart():
    """A request's output blocks chain on its own placeholder: two requests with the same
    prompt on one pod share the prompt's blocks and store each its own output blocks (none
    deduplicated into the other's), as two different streams would."""
    from engine.core import CacheConfig, SchedulerConfig
    from engine.simulate.cost import StepCost
    from engine.simulate.pod import RequestTimes, SimPod
    from engine.simulate.trace import TracedRequest

    pod = SimPod(0, SchedulerConfig(max_model_len=4096, max_num_batched_tokens=2048, max_num_seqs=4),
                 CacheConfig(block_size=16, num_blocks=256), StepCost(0.01, 0, 0, 0))
    for k in range(2):
        tr = TracedRequest(f"r{k}", 0.0, None, 48, hash_ids=(5,), num_prompt_tokens=64)
        pod.arrive(tr, k, RequestTimes(0, 0.0), tr.tokens())
    while pod.busy():
        pod.start_step(pod.clock)
        pod.finish_step()
    # 64 prompt tokens: 4 full blocks, stored once; 64 + 48 = 112 tokens: 3 output blocks
    # full by the last sample (its K/V never computed: 2 stored) per request
    assert pod.num_blocks_stored == 4 + 2 * 2
    assert len(pod.kv.pool.cached) == 4 + 2 * 2


def test_mooncake_partial_last_block_is_the_start_of_that_id_s_block():
    assert mooncake_tokens([5, 6], 600)[512:] == mooncake_tokens([6], 512)[:88]


def test_read_mooncake_orders_by_time_and_keeps_hash_ids(tmp_path):
    p = _write(tmp_path, [{"timestamp": 900, "input_length": 10, "output_length": 3, "hash_ids": [1]},
                          {"timestamp": 100, "input_length": 513, "output_length": 0, "hash_ids": [1, 2]}])
    t = read_mooncake(p)
    assert [r.arrival_s for r in t.requests] == [0.1, 0.9]
    assert t.requests[0].num_prompt_tokens == 513 and t.requests[0].output_length == 1  # 0 -> 1
    assert t.requests[0].tokens()[:10] == t.requests[1].tokens()
    assert read_jsonl(p).requests == t.requests  # recognised by its fields


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}, "need 2"),
    ({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": ["x"]}, "list of integers"),
    ({"timestamp": -1, "input_length": 5, "output_length": 2, "hash_ids": [1]}, "milliseconds"),
])
def test_bad_mooncake_lines_name_the_line_and_field(tmp_path, line, message):
    good = {"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}
    p = _write(tmp_path, [good, line])
    with pytest.raises(TraceError, match=message) as e:
        read_mooncake(p)
    assert ":2:" in str(e.value)


def test_jsonl_requests_with_token_ids_and_prompts(tmp_path):
    from tests.tiny_models import tiny_model_dir

    p = _write(tmp_path, [{"timestamp_ms": 50, "token_ids": [5, 6, 7], "max_tokens": 4},
                          {"timestamp_ms": 0, "prompt": "hello there", "output_length": 2, "client": "c1"}])
    with pytest.raises(TraceError, match="needs a tokenizer"):
        read_jsonl(p)
    d = str(tiny_model_dir("llama"))
    t = read_jsonl(p, d)
    from engine.tokenizer import Tokenizer

    assert t.requests[0].prompt_token_ids == tuple(Tokenizer(d).encode("hello there"))
    assert t.requests[0].client == "c1" and t.requests[1].output_length == 4


@pytest.mark.parametrize("obj, message", [
    ({"token_ids": []}, "non-empty"), ({"token_ids": [1, -2], "max_tokens": 1}, "integers >= 0"),
    ({"token_ids": [1]}, "'max_tokens' must be an integer >= 1"), ({"text": "x"}, "needs 'token_ids'"),
])
def test_bad_jsonl_requests(tmp_path, obj, message):
    with pytest.raises(TraceError, match=message):
        read_jsonl(_write(tmp_path, [obj]))


def test_the_shipped_trace_is_what_the_generator_makes():
    """data/traces/mooncake_conversation_300.jsonl: regenerated from its stated command."""
    shape = calibrate(Shape(num_requests=300, duration_s=300, mean_input=3000, mean_output=64), 0.37)
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in generate(shape))
    assert SHIPPED.read_text() == text
    s = stats(generate(shape))
    assert s["requests"] == 300 and abs(s["mean_input"] - 3000) < 150
    assert 0.30 < s["reusable_block_share"] < 0.44


def test_generated_conversations_resend_their_history(tmp_path):
    recs = generate(Shape(num_requests=400, mean_turns=3.0, mean_input=4000, seed=3))
    assert len(read_mooncake(_write(tmp_path, recs)).requests) == 400  # every record well formed
    by_prefix = 0
    for i, r in enumerate(recs):
        for q in recs[:i]:
            k = q["input_length"] // MOONCAKE_BLOCK
            if k and r["hash_ids"][:k] == q["hash_ids"][:k] and r["input_length"] > q["input_length"]:
                by_prefix += 1
                break
    assert by_prefix > 100  # later turns start with an earlier turn's whole blocks


def test_an_attached_run_becomes_the_requests_its_block_stored_chains_show(tmp_path):
    """Batch 2 extends batch 1's last block: the same request's next chunk. Batch 3 hangs
    off batch 1's first block: a new request, whose prompt is its chain from the root.
    Simulated, the third hits the shared block; the report says the trace is a lower bound."""
    from engine.core import CacheConfig, SchedulerConfig
    from engine.events.schema.step import StepRecord
    from engine.events.schema.types import KVBlockStored
    from engine.simulate.cost import StepCost
    from engine.simulate.report import MISS_CAUSES_OFF, summarize
    from engine.simulate.simulation import SimConfig, simulate
    from engine.simulate.trace import ATTACHED_NOTE, read_run
    from engine.store.recorder import Recorder
    from engine.store.runs import RunStore

    bs = 4
    blk = lambda k: tuple(range(10 * k, 10 * k + bs))  # noqa: E731
    events = [KVBlockStored(0, "pod-a", ("h1", "h2"), None, blk(1) + blk(2), bs, 100.0),
              KVBlockStored(0, "pod-a", ("h3",), "h2", blk(3), bs, 100.5),
              KVBlockStored(0, "pod-a", ("h9",), "h1", blk(9), bs, 102.0)]
    db = str(tmp_path / "runs.sqlite")
    rec = Recorder(db)
    rid = rec.start_run({"pods": [{"pod": "pod-a"}]}, label="attached", kind="attached")
    for i, e in enumerate(events):
        rec.record_step(StepRecord(i, 0, e.ts, [e], {}), rid)
    rec.close()
    trace = read_run(RunStore(db), rid)
    assert trace.notes == (ATTACHED_NOTE,) and trace.config == {"block_size": bs}
    assert [r.prompt_token_ids for r in trace.requests] == [blk(1) + blk(2) + blk(3) + (0,), blk(1) + blk(9) + (0,)]
    assert [r.arrival_s for r in trace.requests] == [0.0, 2.0]
    cfg = SimConfig(1, "round-robin", SchedulerConfig(max_model_len=64, max_num_batched_tokens=64),
                    CacheConfig(block_size=bs, num_blocks=32), StepCost(0.01, 0.0, 0.0, 0.0))
    s = summarize(simulate(trace, cfg))
    assert s["prefix_cache_hits"] == bs and s["notes"] == [ATTACHED_NOTE, MISS_CAUSES_OFF]

"""The engine core behind its two clients (engine.engine_core, issue 29).

The process client must be the in-process one seen through a pipe: the same outputs
token for token and the same events step for step, on a workload with every kind of
step (prefill chunks, n=2 forks with logprobs, prefix hits, preemption under a small
pool). What crosses must be what the step did: a step's message may not grow with the
text a request has generated so far (the old process seam sent the whole text every
step: ~5 KB at token 1,000).
"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.core import SamplingParams
from engine.core.core_step import CoreStep
from engine.engine_core import messages as m
from engine.llm_engine import LLMEngine

SMALL_POOL = dict(block_size=4, num_kv_blocks=24, max_model_len=64, max_num_batched_tokens=32, num_threads=1)


def _workload(eng: LLMEngine) -> tuple[dict, list]:
    records = []
    eng.step_listeners.append(records.append)
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    shared = list(range(3, 23))  # 5 full blocks every prompt below starts with
    for i in range(4):
        eng.add_request(prompt=shared + [30 + i, 40 + i], params=greedy, request_id=f"g{i}")
    eng.add_request(prompt="fork me please", request_id="n2",
                    params=SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8, logprobs=2, ignore_eos=True))
    eng.add_request(messages=[{"role": "user", "content": "hi"}], params=greedy, request_id="chat")
    # prompt logprobs across chunks (32 tokens a step) and any preemption, without a prefix hit
    eng.add_request(prompt=shared + list(range(50, 70)), request_id="plp",
                    params=SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=2))
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = [(c.text, list(c.token_ids), c.finish_reason, c.logprobs)
                                        for c in out.outputs] + [out.prompt_logprobs]
    return done, records


def test_the_process_core_is_the_inproc_core(tiny_llama):
    runs = {}
    for here in (True, False):
        eng = LLMEngine.from_config(EngineConfig(model=tiny_llama, engine_core_process=not here, **SMALL_POOL))
        try:
            runs[here] = _workload(eng), eng.stats(), eng.snapshot()
        finally:
            eng.close()
    (done, records), stats, snap = runs[True]
    (pdone, precords), pstats, psnap = runs[False]
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0  # every kind of step ran
    assert pdone == done and len(done) == 7
    assert [r.seq for r in precords] == [r.seq for r in records] == list(range(len(records)))
    assert [r.events for r in precords] == [r.events for r in records]  # step for step
    assert pstats == stats and psnap == snap


def test_every_step_crosses_the_wire_as_it_was(tiny_llama):
    from engine.engine_core.startup import build_engine_core

    core = build_engine_core(EngineConfig(model=tiny_llama, **SMALL_POOL))
    eng = LLMEngine(core.config, _Recording(core))  # the core is its own in-process client
    _workload(eng)
    assert len(eng.core.steps) > 10
    for step in eng.core.steps:
        assert m.decode(m.encode(step), CoreStep) == step


def test_a_call_crosses_as_its_name_and_typed_args():
    name, args = m.call_decoder.decode(m.encode(("step", (["a"], True))))
    assert (name, m.decode_args(name, args)) == ("step", (["a"], True))
    with pytest.raises(TypeError, match="no call 'close'"):  # only what CALLS lists is answered
        m.decode_args("close", m.encode(()))


class _Recording:
    """The in-process core, keeping every CoreStep it hands over."""

    def __init__(self, core) -> None:
        self.inner, self.steps = core, []

    def step(self, stop_ids, summary):
        out = self.inner.step(stop_ids, summary)
        self.steps.append(out)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_step_message_does_not_grow_with_the_text_generated(tiny_llama):
    eng = LLMEngine.from_config(EngineConfig(model=tiny_llama, engine_core_process=True, block_size=16,
                                             max_model_len=512, num_threads=1))
    sizes: list[int] = []
    conn = eng.core._conn
    recv = conn.recv_bytes

    def recording():
        raw = recv()
        sizes.append(len(raw))
        return raw

    conn.recv_bytes = recording
    per_step = []  # the largest message of each step (the step's answer)
    try:
        eng.add_request(prompt=[5] * 20, request_id="long",
                        params=SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True, logprobs=1))
        while eng.has_unfinished_requests():
            sizes.clear()
            (out,) = eng.step()
            per_step.append(max(sizes))
        assert len(out.outputs[0].token_ids) == 400
    finally:
        eng.close()
    early = max(per_step[20:60])  # decode steps across several blocks (a block's events included)
    assert early < 1200  # one token, its logprob, the step's events and the pool summary (~820 B)
    # 60 tokens in or 399: the same size, to what msgpack's ints take (a count or token id
    # past 127 or 255 takes 1-2 bytes more; a block's 16 token ids up to 32). The last step
    # frees the request's 27 blocks: that is what it did.
    big = [(i, n) for i, n in enumerate(per_step[:-1]) if i >= 60 and n > early + 48]
    assert big == [], (early, big, len(per_step))


def test_prompt_logprobs_cross_only_for_the_request_that_asks(tiny_llama):
    """A prefill with prompt logprobs sends them (what the step computed: O(its tokens));
    its decode steps are the size of a request's without them."""
    eng = LLMEngine.from_config(EngineConfig(model=tiny_llama, engine_core_process=True, block_size=16,
                                             max_model_len=512, num_threads=1,
                                             enable_prefix_caching=False))
    conn = eng.core._conn
    recv = conn.recv_bytes
    sizes: list[int] = []

    def recording():
        raw = recv()
        sizes.append(len(raw))
        return raw

    conn.recv_bytes = recording
    runs = {}
    try:
        for rid, plp in (("plain", None), ("plp", 2)):
            eng.add_request(prompt=list(range(5, 45)), request_id="r", params=SamplingParams(
                temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=plp))
            per_step = []
            while eng.has_unfinished_requests():
                sizes.clear()
                (out,) = eng.step()
                per_step.append(max(sizes))
            runs[rid] = (per_step, out)
    finally:
        eng.close()
    (plain, _), (asked, out) = runs["plain"], runs["plp"]
    assert len(out.prompt_logprobs) == 40 and out.prompt_logprobs[0] is None
    assert [e.token_id for e in out.prompt_logprobs[1:]] == list(range(6, 45))
    assert asked[0] > plain[0] + 39 * 8  # 39 entries: id, logprob, rank, 2 alternatives each
    assert asked[1:-1] == plain[1:-1]  # decode steps: nothing more crosses

"""The straight step on the tiny model: who owns what, per request.

Stop strings finish at the next schedule, fork identity is (parent_id, sample_index),
the runner keeps and drops sampling state through the scheduler output, admission is
atomic, one step clock, the attention plan once per step, per-request stats, and the
capped default KV pool.
"""

import logging

import pytest

from engine import SamplingParams
from engine.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from engine.core import KVScopeError, SamplingParamsError, child_request_id
from engine.events.schema import types as event_types
from engine.engine_core.startup import default_cpu_blocks
from engine.llm_engine import build_engine

PROMPT = list(range(40, 58))  # 18 tokens


def _engine(tiny_llama, **kw):
    cfg = dict(model=tiny_llama, block_size=4, num_kv_blocks=64, max_model_len=96)
    return build_engine(EngineConfig(**{**cfg, **kw}))


def _drain(eng):
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    return outs


def test_a_stop_string_finishes_at_the_next_schedule_and_frees_its_blocks(tiny_llama):
    eng = _engine(tiny_llama)
    ref = _engine(tiny_llama)
    ref.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    text = [o for o in _drain(ref) if o.finished][0].outputs[0].text
    stop = text[5:7]
    assert stop and text.find(stop) == 5
    records = []
    eng.step_listeners.append(records.append)
    eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]),
                    request_id="s")
    free_before = eng.engine_core.scheduler.kv.pool.num_free
    while True:
        (out,) = eng.step()
        if out.finished:
            break
    c = out.outputs[0]
    assert (c.finish_reason, c.stop_reason, c.text) == ("stop", stop, text[:5])
    # the user's output is final, but the core still holds the request until it schedules
    assert eng.engine_core.scheduler.requests["s"].status.value == "running"
    assert eng.engine_core.scheduler.kv.block_ids("s") and eng.has_unfinished_requests()
    assert not any(e.type == "request_finished" for e in records[-1].events)
    assert eng.step() == []  # the next schedule applies the finish; nothing is computed
    finished = [e for e in records[-1].events if e.type == "request_finished"]
    assert [(e.request_id, e.reason) for e in finished] == [("s", "stop")]
    assert not [e for e in records[-1].events if e.type == "request_scheduled"]
    assert eng.engine_core.scheduler.kv.block_ids("s") == [] and not eng.has_unfinished_requests()
    assert eng.engine_core.scheduler.kv.pool.num_free == free_before
    assert "s" not in eng.engine_core.runner.requests  # the same schedule told the runner to drop it


def test_fork_identity_is_parent_and_sample_index(tiny_llama):
    eng = _engine(tiny_llama)
    records = []
    eng.step_listeners.append(records.append)
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=4, seed=5), request_id="f")
    eng.step()  # prefill + fork
    children = {rid: r for rid, r in eng.engine_core.scheduler.requests.items() if r.parent_id is not None}
    assert sorted((r.parent_id, r.sample_index) for r in children.values()) == [("f", 1), ("f", 2)]
    assert sorted(children) == [child_request_id("f", 1), child_request_id("f", 2)]
    root = eng.engine_core.scheduler.requests["f"]
    assert (root.parent_id, root.sample_index) == (None, 0)
    # seeds: the parent's plus the sample index; each sample has its own generator
    assert [children[child_request_id("f", k)].seed for k in (1, 2)] == [6, 7]
    gens = [eng.engine_core.runner.requests[rid].generator for rid in ("f", *sorted(children))]
    assert len({id(g) for g in gens}) == 3 and [g.initial_seed() for g in gens] == [5, 6, 7]
    forked = [e for e in records[-1].events if isinstance(e, event_types.RequestForked)]
    assert [(e.request_id, e.parent_id) for e in forked] == [(child_request_id("f", k), "f") for k in (1, 2)]
    outs = _drain(eng)
    final = [o for o in outs if o.finished][0]
    assert final.request_id == "f" and [c.index for c in final.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 4 for c in final.outputs)
    with pytest.raises(KVScopeError, match="no spaces, '#'"):
        eng.add_request(PROMPT, SamplingParams(max_tokens=1), request_id=child_request_id("g", 1))


def test_the_runner_keeps_sampling_state_until_the_scheduler_says_finished(tiny_llama):
    eng = _engine(tiny_llama)
    eng.add_request(PROMPT, SamplingParams(temperature=0.8, max_tokens=2, seed=1), request_id="short")
    eng.add_request(PROMPT[:7], SamplingParams(temperature=0, max_tokens=6), request_id="long")
    assert eng.engine_core.runner.requests == {}  # nothing reaches the runner before it is scheduled
    eng.step()
    assert set(eng.engine_core.runner.requests) == {"short", "long"}
    assert eng.engine_core.runner.requests["long"].generator is None  # greedy: no generator
    assert eng.engine_core.runner.requests["short"].generator.initial_seed() == 1
    eng.step()  # "short" samples its 2nd token and finishes in the core
    assert "short" not in eng.engine_core.scheduler.requests and "short" in eng.engine_core.runner.requests
    out = eng.engine_core.scheduler.schedule()
    assert out.finished_request_ids == ["short"] and out.new_requests == []
    eng.engine_core.scheduler.update_from_output(out, eng.engine_core.runner.execute(out))
    assert set(eng.engine_core.runner.requests) == {"long"}
    eng.abort_request("long")
    eng.step()
    assert eng.engine_core.runner.requests == {}


def test_admission_is_atomic_and_a_bad_seed_is_refused_at_the_boundary(tiny_llama):
    """Issue 17 item 1: seed 2**64 once entered the scheduler without sampling state and
    every later step raised. Now it never gets past SamplingParams; a top_k the vocabulary
    cannot hold is refused by the engine; neither leaves anything behind."""
    eng = _engine(tiny_llama)
    with pytest.raises(SamplingParamsError, match=r"seed must be None or an integer in \[-2\*\*63, 2\*\*64 - 1\]"):
        SamplingParams.from_dict({"temperature": 1, "seed": 18446744073709551616, "max_tokens": 4})
    with pytest.raises(SamplingParamsError, match="top_k must be at most the vocabulary size"):
        eng.add_request("hi", SamplingParams(temperature=1, top_k=2**63), request_id="k")
    with pytest.raises(KVScopeError, match="max_model_len"):
        eng.add_request(list(range(3, 120)), SamplingParams(max_tokens=1), request_id="long")
    assert not eng.engine_core.scheduler.requests and not eng.output_processor.requests
    # the same ids are free, and the largest seed with n=2 wraps instead of overflowing
    eng.add_request("hi", SamplingParams(temperature=1, seed=2**64 - 1, n=2, max_tokens=3), request_id="k")
    eng.add_request("hi", SamplingParams(temperature=0, max_tokens=3), request_id="long")
    done = {o.request_id: o for o in _drain(eng) if o.finished}
    assert [len(c.token_ids) for c in done["k"].outputs] == [3, 3]
    assert len(done["long"].outputs[0].token_ids) == 3


@pytest.mark.parametrize("bad, match", [
    ({"n": 129}, "n must be an integer in"),
    ({"max_tokens": 2**20 + 1}, "max_tokens must be None or an integer in"),
    ({"min_tokens": -1}, "min_tokens must be an integer in"),
    ({"min_tokens": 5, "max_tokens": 4}, "must not exceed max_tokens"),
    ({"seed": -2**63 - 1}, "seed must be None or an integer"),
    ({"seed": 2**64}, "seed must be None or an integer"),
])
def test_sampling_params_bound_every_count(bad, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**bad)


def test_negative_seeds_are_their_64_bit_twos_complement():
    # vLLM's API takes int64 seeds; torch seeds -1 as 2**64 - 1, and so does kvscope
    assert SamplingParams(seed=-1).seed == 2**64 - 1
    assert SamplingParams(seed=-2**63).seed == 2**63
    assert SamplingParams(seed=7).seed == 7


def test_one_step_clock(tiny_llama):
    eng = _engine(tiny_llama)
    records = []
    eng.step_listeners.append(records.append)
    eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3))
    _drain(eng)
    assert [r.seq for r in records] == list(range(len(records)))
    assert [r.step for r in records] == [r.seq + 1 for r in records]
    assert all(e.step == r.step for r in records for e in r.events)
    assert eng.engine_core.scheduler.step == records[-1].step and eng.snapshot().step == records[-1].step


def test_the_attention_plan_is_built_once_per_step(tiny_llama, monkeypatch):
    from engine.model import attention

    calls = []
    real = attention.build_plan
    monkeypatch.setattr(attention, "build_plan", lambda *a: calls.append(1) or real(*a))
    eng = _engine(tiny_llama)
    assert eng.engine_core.loaded.spec.num_layers > 1
    eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=4))
    eng.add_request(PROMPT[:5], SamplingParams(temperature=0, max_tokens=4))
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
        assert len(calls) == steps


def test_metrics_carry_first_token_and_finished_request_stats(tiny_llama):
    """Block 4, an 8-block pool, 8-token steps: "new" (16 tokens) is preempted in the
    middle of its prefill; its finished stats count its preemptions (vLLM's
    ``request_num_preemptions``)."""
    eng = _engine(tiny_llama, num_kv_blocks=8, max_model_len=32, max_num_batched_tokens=8)
    records = []
    eng.step_listeners.append(records.append)
    eng.add_request(list(range(10, 26)), SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                    request_id="old")
    eng.add_request(list(range(50, 66)), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                    request_id="new")
    _drain(eng)
    first = {f["request_id"]: (r.step, f) for r in records for f in r.metrics["first_tokens"]}
    finished = {f["request_id"]: f for r in records for f in r.metrics["finished_requests"]}
    assert set(first) == set(finished) == {"old", "new"}
    preempted_before_first = [r.step for r in records for e in r.events
                              if isinstance(e, event_types.RequestPreempted) and e.request_id == "new"
                              and r.step < first["new"][0]]
    assert preempted_before_first
    preemptions = {rid: sum(isinstance(e, event_types.RequestPreempted) and e.request_id == rid
                            for r in records for e in r.events) for rid in ("old", "new")}
    assert {rid: f["num_preemptions"] for rid, f in finished.items()} == preemptions
    f = finished["new"]
    assert (f["finish_reason"], f["num_prompt_tokens"], f["num_generation_tokens"], f["n"]) == ("length", 16, 2, 1)
    assert f["prefill_kv_computed_tokens"] == 16 - f["num_cached_tokens"]
    assert 0 <= f["queued_s"] and f["queued_s"] + f["prefill_s"] + f["decode_s"] <= f["e2e_s"] + 1e-9
    assert f["inference_s"] == pytest.approx(f["prefill_s"] + f["decode_s"])
    # the latency lists of the same steps agree with the stats
    assert sorted(t for r in records for t in r.metrics["ttft_s"]) == sorted(
        s["ttft_s"] for _, s in first.values())


def test_streamed_deltas_concatenate_to_the_final_text(tiny_llama):
    """Random sampling on a byte-level vocabulary: many tokens are partial characters."""
    eng = _engine(tiny_llama)
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, max_tokens=80, seed=3, ignore_eos=True, n=2),
                    request_id="r")
    streamed = {0: "", 1: ""}
    for out in _drain(eng):
        for k, (text, _) in out.deltas.items():
            streamed[k] += text
        if out.finished:
            final = out
    for c in final.outputs:
        assert streamed[c.index] == c.text == eng.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_the_default_cpu_pool_is_capped_at_max_num_seqs_full_sequences(tiny_llama, caplog):
    with caplog.at_level(logging.INFO, logger="engine.engine_core.startup"):
        eng = build_engine(EngineConfig(model=tiny_llama, block_size=4, max_model_len=64, max_num_seqs=8))
    per_block = eng.engine_core.kv_bytes_per_block
    assert DEFAULT_CPU_KV_BYTES // per_block > 100_000  # the uncapped 1 GiB pool of a tiny model
    assert eng.engine_core.scheduler.cache_config.num_blocks == 8 * 64 // 4 == 128
    assert "maximum concurrency for 64 tokens per request: 8.00x" in caplog.text
    assert "capped at what max_num_seqs=8 full-length sequences use" in caplog.text
    # a model whose 1 GiB pool is smaller than that keeps the 1 GiB pool
    assert default_cpu_blocks(737_280, 16, 2048, 64) == DEFAULT_CPU_KV_BYTES // 737_280 == 1456
    # an explicit size is never capped
    assert _engine(tiny_llama, num_kv_blocks=300, max_num_seqs=1).engine_core.scheduler.cache_config.num_blocks == 300


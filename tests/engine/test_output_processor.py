"""The output processor on the tiny byte-level tokenizer: incremental detokenization
(multi-byte characters split across tokens), stop strings, deltas and logprobs.

The core's per-step outputs are built by hand here, so each token is chosen; the
same processor runs inside the engine (tests/engine/test_engine_step.py)."""

import random

import pytest

from engine.core import CoreStep, EngineCoreOutput, SampledToken, SamplingParams
from engine.output_processor import OutputProcessor
from engine.output_processor.detokenizer import IncrementalDetokenizer
from engine.tokenizer import Tokenizer

# 2-, 3- and 4-byte UTF-8 characters; the tiny vocabulary has one token per byte for them
TEXT = "héllo 日本語 ok — ✓ 𝄞!"


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return Tokenizer(tiny_llama)


def _run(tokenizer, ids, params, finish="length", rid="r"):
    """Feed ``ids`` one per step; the core finishes the request (``finish``) on the last."""
    proc = OutputProcessor(tokenizer)
    proc.add_request(proc.new_request(rid, None, [5, 6, 7], params, arrival_time=0.0))
    out_ids, steps = [], []
    for i, t in enumerate(ids):
        out_ids.append(t)
        last = i == len(ids) - 1
        o = EngineCoreOutput(rid, None, 0, SampledToken(t, -0.5 if params.logprobs is not None else None,
                                                           ((t, -0.5),) if params.logprobs else None),
                             finish if last else None, None, 0, 0)
        steps.append(proc.process_outputs(CoreStep(i + 1, 0.5, [o]), now=1.0 + i))
        if rid not in proc.requests:
            break
    return proc, steps


def _deltas(steps):
    return [d[0][0] for p in steps for out in p.request_outputs for d in [out.deltas] if 0 in d]


def test_characters_split_across_tokens_stream_whole(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert sum(tokenizer.decode([i]) == "\ufffd" for i in ids) >= 8  # many tokens are partial bytes
    _, steps = _run(tokenizer, ids, SamplingParams(max_tokens=100))
    deltas = _deltas(steps)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT
    final = steps[-1].request_outputs[0]
    assert final.finished and final.outputs[0].text == TEXT
    assert final.outputs[0].token_ids == ids and type(final.outputs[0].token_ids) is list
    # a 4-byte character held back three steps, then released whole
    assert "𝄞" in deltas


@pytest.mark.parametrize("skip", [True, False])
def test_the_detokenizer_equals_a_full_decode_on_any_ids(tokenizer, skip):
    """Random ids (specials, stray continuation bytes, truncated characters) included:
    the pieces plus the final flush are exactly ``decode`` of the whole sequence."""
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 30))]
        det = IncrementalDetokenizer(tokenizer, skip)
        text = "".join(det.add(i) for i in ids) + det.flush()
        assert text == tokenizer.decode(ids, skip_special_tokens=skip), ids


def test_stop_string_is_cut_and_never_streamed(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    proc, steps = _run(tokenizer, ids, SamplingParams(max_tokens=100, stop=["本語"]))
    final = steps[-1].request_outputs[0]
    c = final.outputs[0]
    assert final.finished and (c.finish_reason, c.stop_reason, c.text) == ("stop", "本語", "héllo 日")
    assert "".join(_deltas(steps)) == "héllo 日"  # held back (1 char) until the match settled
    # the stop is reported once, for the core to apply at its next schedule
    assert [p.reqs_to_stop for p in steps].count(["r"]) == 1 and steps[-1].reqs_to_stop == ["r"]
    # its tokens are the ones up to the token that completed the match
    n = len(tokenizer.encode("héllo 日本語", add_special_tokens=False))
    assert len(c.token_ids) == n and "r" not in proc.requests


def test_stop_string_kept_when_asked(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    _, steps = _run(tokenizer, ids, SamplingParams(max_tokens=100, stop=["ok", "日本"],
                                                   include_stop_str_in_output=True))
    c = steps[-1].request_outputs[0].outputs[0]
    assert (c.text, c.stop_reason) == ("héllo 日本", "日本")
    assert "".join(_deltas(steps)) == "héllo 日本"


def test_a_stop_the_core_already_finished_is_not_reported_again(tokenizer):
    ids = tokenizer.encode("ab", add_special_tokens=False)
    _, steps = _run(tokenizer, ids, SamplingParams(stop=["b"]), finish="length")
    c = steps[-1].request_outputs[0].outputs[0]
    assert (c.finish_reason, c.stop_reason, c.text) == ("stop", "b", "a")  # the stop string wins
    assert all(p.reqs_to_stop == [] for p in steps)  # the core has finished it already


def test_logprobs_grow_in_place(tokenizer):
    ids = tokenizer.encode("hello there", add_special_tokens=False)
    _, steps = _run(tokenizer, ids, SamplingParams(logprobs=1))
    lists = [p.request_outputs[0].outputs[0].logprobs for p in steps]
    assert all(lp is lists[0] for lp in lists)  # one list, appended per token, never copied
    assert len(lists[0]) == len(ids) and lists[0][0] == {ids[0]: -0.5}
    final = steps[-1].request_outputs[0].outputs[0]
    assert final.cumulative_logprob == pytest.approx(-0.5 * len(ids))


def test_timings_and_request_stats(tokenizer):
    ids = tokenizer.encode("hello", add_special_tokens=False)
    _, steps = _run(tokenizer, ids, SamplingParams())
    (first,) = steps[0].first_tokens
    assert (first.request_id, first.num_prompt_tokens, first.ttft_s) == ("r", 3, 1.0)
    assert steps[0].latencies.ttft_s == (1.0,) and steps[1].latencies.itl_s == (1.0,)
    (fin,) = steps[-1].finished_requests
    n = len(ids)
    assert (fin.finish_reason, fin.num_generation_tokens, fin.max_num_generation_tokens) == ("length", n, n)
    assert fin.queued_s == 0.5 and fin.prefill_s == 0.5 and fin.decode_s == n - 1.0
    assert fin.inference_s == n - 0.5 and fin.e2e_s == float(n)
    assert fin.mean_time_per_output_token_s == 1.0
    assert steps[-1].latencies.e2e_s == (float(n),)
    m = steps[-1].request_outputs[0].metrics
    assert (m.arrival_time, m.first_scheduled_time, m.first_token_time, m.finished_time) == (0.0, 0.5, 1.0, n)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_tokens_text_is_left_out_as_vllm_does(tokenizer, include):
    """The core stops the request on a stop token (EOS or stop_token_ids): vLLM's
    detokenizer leaves that token's text out unless include_stop_str_in_output; the
    token id stays, and the request's preemptions reach its finished stats."""
    ids = tokenizer.encode("ok, fine!", add_special_tokens=False)
    stop = ids[-1]
    params = SamplingParams(max_tokens=20, stop_token_ids=[stop], include_stop_str_in_output=include)
    proc = OutputProcessor(tokenizer)
    proc.add_request(proc.new_request("r", None, [5, 6, 7], params, arrival_time=0.0))
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        o = EngineCoreOutput("r", None, 0, SampledToken(t), "stop" if last else None, stop if last else None,
                             0, num_preemptions=2 if i >= 2 else 0)
        p = proc.process_outputs(CoreStep(i + 1, 0.5, [o]), now=1.0 + i)
    out = p.request_outputs[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop and out.token_ids == ids
    assert out.text == ("ok, fine!" if include else tokenizer.decode(ids[:-1]))
    assert [f.num_preemptions for f in p.finished_requests] == [2]

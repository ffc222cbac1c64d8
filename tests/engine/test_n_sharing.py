"""n_sharing on the real engine: copy-on-write forks (paper / vLLM v0) against vLLM v1's
child requests sharing full prompt blocks through the prefix cache."""

import random

import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from engine.core import ConfigError, child_request_id
from engine.events.folds.reducer import PoolState
from engine.events.schema.step import StepRecord
from engine.protocol import Restart
from engine.llm_engine import build_engine

PROMPT = list(range(40, 58))  # 18 tokens: 4 full blocks of 4 and 2 tokens in a fifth


def _engine(model, n_sharing, **kw):
    cfg = dict(model=model, block_size=4, num_kv_blocks=32, max_model_len=64, n_sharing=n_sharing)
    return build_engine(EngineConfig(**(cfg | kw)))


def _drain(eng):
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                assert out.request_id not in done, "a request finished twice"
                done[out.request_id] = out
    return done


def _tables(eng, rid, n):
    snap = eng.snapshot()
    return [list(snap.requests[r].block_table) for r in
            [rid] + [child_request_id(rid, k) for k in range(1, n)]]


def _refs(eng, n):
    return [b.ref_count for b in eng.snapshot().blocks[:n]]


def test_cow_block_ids_and_ref_counts(tiny_llama):
    eng = _engine(tiny_llama, "cow")
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=4, seed=5), request_id="f")
    eng.step()  # prefill once, fork: every block shared, the partial one too
    assert _tables(eng, "f", 3) == [[0, 1, 2, 3, 4]] * 3
    assert _refs(eng, 6) == [3, 3, 3, 3, 3, 0]
    eng.step()  # the first two writers into block 4 copy it, the last writes in place
    assert _tables(eng, "f", 3) == [[0, 1, 2, 3, 5], [0, 1, 2, 3, 6], [0, 1, 2, 3, 4]]
    assert _refs(eng, 8) == [3, 3, 3, 3, 1, 1, 1, 0]
    assert eng.stats()["cow_copies"] == 2 and eng.stats()["prefix_cache_hits"] == 0


def test_prefix_cache_block_ids_and_ref_counts(tiny_llama):
    eng = _engine(tiny_llama, "prefix_cache")
    records = []
    eng.step_listeners.append(records.append)
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=4, seed=5), request_id="f")
    assert sorted(eng.engine_core.scheduler.requests) == ["f", "f#1", "f#2"]  # entered as three requests
    eng.step()  # f computes 18 tokens; f#1 and f#2 hit its 4 full blocks, compute 2 each
    assert _tables(eng, "f", 3) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3, 6]]
    assert _refs(eng, 8) == [3, 3, 3, 3, 1, 1, 1, 0]
    scheduled = {e.request_id: (e.num_computed_tokens, e.num_tokens) for e in records[0].events
                 if e.type == "request_scheduled"}
    assert scheduled == {"f": (0, 18), "f#1": (16, 2), "f#2": (16, 2)}
    # seeds: the parent's plus the sample index, as the cow children get
    gens = [eng.engine_core.runner.requests[r].generator.initial_seed() for r in ("f", "f#1", "f#2")]
    assert gens == [5, 6, 7]
    eng.step()
    assert _tables(eng, "f", 3) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5], [0, 1, 2, 3, 6]]
    _drain(eng)
    kinds = {e.type for r in records for e in r.events}
    assert not kinds & {"cow_copy", "request_forked"}
    assert eng.stats()["cow_copies"] == 0 and eng.stats()["prefix_cache_hits"] == 32
    assert eng.engine_core.scheduler.kv.pool.num_free == 32


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, n=3, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=1.0, n=3, max_tokens=10, seed=11, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, n=2, max_tokens=10, seed=3, ignore_eos=True),
], ids=["greedy", "seeded", "seeded-top-p"])
def test_both_modes_give_the_same_samples(tiny_llama, params):
    """Same prompt, same seeds: sample k draws from the same logits with the same
    generator in both modes, so the tokens agree sample for sample."""
    got = {}
    for mode in ("cow", "prefix_cache"):
        eng = _engine(tiny_llama, mode)
        eng.add_request(PROMPT, params, request_id="s")
        out = _drain(eng)["s"]
        assert [c.index for c in out.outputs] == list(range(params.n))
        got[mode] = [list(c.token_ids) for c in out.outputs]
    assert got["cow"] == got["prefix_cache"]
    if params.temperature == 0:
        assert len({tuple(t) for t in got["cow"]}) == 1  # greedy samples are all alike
    else:
        assert len({tuple(t) for t in got["cow"]}) > 1


def test_abort_finishes_children_that_have_not_run_yet(tiny_llama):
    eng = _engine(tiny_llama, "prefix_cache")
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=4, seed=1), request_id="a")
    out = eng.abort_request("a")
    assert out.finished and not eng.has_unfinished_requests()
    eng.add_request(PROMPT, SamplingParams(temperature=1.0, n=3, max_tokens=8, seed=1), request_id="b")
    eng.step()
    eng.abort_request("b")
    assert not eng.has_unfinished_requests() and eng.engine_core.scheduler.kv.pool.num_free == 32


def test_step_records_rebuild_engine_state_in_prefix_cache_mode(tiny_llama):
    eng = _engine(tiny_llama, "prefix_cache", num_kv_blocks=24, max_num_batched_tokens=16,
                  max_num_seqs=6)
    state = PoolState(24, 4)
    kinds = set()

    def fold(record):
        record = StepRecord.from_json(record.to_json())
        kinds.update(e.type for e in record.events)
        state.apply_step(record)
        assert state.to_snapshot() == eng.snapshot(), f"drift at step {record.step}"

    eng.step_listeners.append(fold)
    rng = random.Random(0)
    system = list(range(100, 113))
    for i in range(10):
        prompt = system + [rng.randrange(3, 250) for _ in range(rng.randrange(1, 12))]
        eng.add_request(prompt, SamplingParams(temperature=0.8, n=3 if i % 4 == 1 else 1,
                                               max_tokens=rng.randrange(4, 14), seed=i))
        if i % 2:
            eng.step()
    outs = _drain(eng)
    assert {"prefix_hit", "block_evicted", "request_preempted"} <= kinds
    assert not kinds & {"cow_copy", "request_forked"}
    # the output processor groups each request's samples: 7 requests of 1, 3 of n=3
    assert sorted([c.index for c in o.outputs] for o in outs.values()) == [[0]] * 7 + [[0, 1, 2]] * 3


def test_n_sharing_is_validated_and_a_restart_can_change_it(tiny_llama):
    with pytest.raises(ConfigError, match="n_sharing must be one of"):
        EngineConfig(model=tiny_llama, n_sharing="fork")
    assert Restart({"n_sharing": "prefix_cache"}).engine == {"n_sharing": "prefix_cache"}
    old = _engine(tiny_llama, "cow")
    new = old.restart({"n_sharing": "prefix_cache"})
    assert new.engine_core.scheduler.config.n_sharing == "prefix_cache" and new.describe()["n_sharing"] == "prefix_cache"
    with pytest.raises(ConfigError):
        new.restart({"n_sharing": "both"})

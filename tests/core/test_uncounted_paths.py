"""The core's paths for a log that keeps no events (a benchmark, a simulation that records
nothing) and its batched block operations do exactly what the event-keeping paths do:
the same block ids, ref counts, free queue, hashes, tables, step outputs and counts."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.core import CacheConfig, Scheduler, SchedulerConfig
from engine.core.event_log import EventLog
from engine.core.model_runner_output import ModelRunnerOutput, SampledToken
from engine.core.hashing import BlockHasher, VLLM_NONE_HASH_SEED
from engine.events.metrics.event_counts import EventCounts

from tests.core.driver import req, step
from tests.core.test_invariants import check_invariants, op, run_ops


def _cores(prefix: bool, chunk: int, n_sharing: str, num_blocks: int = 10):
    """A core that keeps events, a bare one, and a bare one not ``for_engine`` (a
    simulated pod's: no runner inputs, no outputs)."""
    def make(keep: bool, for_engine: bool = True) -> Scheduler:
        return Scheduler(SchedulerConfig(max_model_len=40, max_num_batched_tokens=chunk, max_num_seqs=4,
                                         n_sharing=n_sharing),
                         CacheConfig(block_size=4, num_blocks=num_blocks, enable_prefix_caching=prefix),
                         EventLog(enabled=keep), for_engine=for_engine)
    return make(True), make(False), make(False, for_engine=False)


def _state(s: Scheduler):
    snap = s.snapshot()
    for rid, ids in s.kv._ids.items():  # block_ids' kept lists follow their tables
        assert ids == [b.id for b in s.kv.tables.get(rid, ())]
    return (snap, s.kv.pool.free_queue.ids(), dict(s.kv.hashes), dict(s.kv.num_hashed),
            {rid: list(ids) for rid, ids in s.kv._ids.items()}, s.kv.pool.num_cached_free,
            s.kv.misses.num_remembered, [r.request_id for r in s.waiting], [r.request_id for r in s.running])


def _no_ids(state):
    return state[:4] + state[5:]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=40), prefix=st.booleans(), chunk=st.sampled_from([3, 8, 64]),
       n_sharing=st.sampled_from(["cow", "prefix_cache"]))
def test_a_core_that_keeps_no_events_makes_the_same_decisions_and_counts(ops, prefix, chunk, n_sharing):
    kept, bare, sim = _cores(prefix, chunk, n_sharing)
    outs = {id(kept): [], id(bare): [], id(sim): []}
    events = []

    def record(s):
        check_invariants(s)
        if s is kept:
            events.extend(s.log.drain())
        outs[id(s)].append(_state(s))

    for s in (kept, bare, sim):
        run_ops(s, ops, record)
    assert not bare.log.events and not sim.log.events
    assert outs[id(kept)] == outs[id(bare)]
    # the same but block_ids' kept lists, which only a runner's block tables build
    assert [_no_ids(x) for x in outs[id(bare)]] == [_no_ids(x) for x in outs[id(sim)]]
    assert not sim.kv._ids
    assert sim.log.counts == bare.log.counts == kept.log.counts == EventCounts.of(events)


def test_scheduled_requests_are_equal_step_for_step_under_memory_pressure():
    kept, bare, sim = _cores(True, 8, "cow", num_blocks=12)
    for s in (kept, bare, sim):
        for k in range(6):
            s.add_request(req(f"r{k}", [1, 2, 3, 4, 5, 6, 7, 8] + [k] * (3 + k), max_tokens=6, n=1 + k % 2))
    for _ in range(60):
        if not kept.has_unfinished_requests():
            break
        a, b = step(kept)[0], step(bare)[0]
        assert (a.scheduled, a.cow_pairs, a.preempted, a.new_requests, a.finished_request_ids) == \
            (b.scheduled, b.cow_pairs, b.preempted, b.new_requests, b.finished_request_ids)
        c = step(sim)[0]  # the same step without a runner's inputs
        assert [dataclasses.replace(x, block_table=[], slot_mapping=[]) for x in a.scheduled] == c.scheduled
        assert all(x.block_table == x.slot_mapping == [] for x in c.scheduled)
        assert (a.cow_pairs, a.preempted, a.new_requests, a.finished_request_ids) == \
            (c.cow_pairs, c.preempted, c.new_requests, c.finished_request_ids)
        assert _no_ids(_state(sim)) == _no_ids(_state(bare))
    assert not bare.has_unfinished_requests() and not sim.has_unfinished_requests()
    assert kept.log.counts == bare.log.counts == sim.log.counts and kept.log.counts.num_evictions > 0


def test_a_core_not_for_engine_returns_no_outputs_and_its_requests_say_what_happened():
    eng, _, sim = _cores(True, 64, "cow")
    for s in (eng, sim):
        s.add_request(req("a", [1, 2, 3, 4, 5], max_tokens=1))
        out = s.schedule()
        core = s.update_from_output(out, ModelRunnerOutput({"a": SampledToken(7)}))
        assert [(o.request_id, o.new_token, o.finish_reason) for o in core.outputs] == (
            [("a", SampledToken(7), "length")] if s is eng else [])
        assert "a" not in s.requests and s.kv.pool.num_free == 10
    assert eng.log.counts == sim.log.counts


def _one_by_one(h: BlockHasher, toks, bs, extra=None) -> list[str]:
    out, parent = [], None
    for i in range(len(toks) // bs):
        parent = h(parent, toks[i * bs:(i + 1) * bs], extra)
        out.append(parent)
    return out


def test_full_blocks_chains_digests_as_one_block_at_a_time_does():
    for algo in ("sha256", "sha256_cbor", "kvscope"):
        h = BlockHasher(algo, seed=VLLM_NONE_HASH_SEED)
        for toks, bs in (([49151, 0, 300, 70000, 5, 6, 7, 8, 2**40, 17, 3, 3], 4), (list(range(50)), 16),
                         ([True, False, 2, 3], 2), (list(np.arange(40, dtype=np.int64)), 8)):
            want = _one_by_one(h, toks, bs)
            assert h.full_blocks(toks, bs, []) == want
            assert h.full_blocks(toks, bs, [], "") == want
            assert h.full_blocks(toks, bs, want[:1]) == want  # extends what is known
            assert h.full_blocks(toks, bs, [], num_blocks=2) == want[:2]
            assert h.full_blocks(toks[:bs * 2], bs, list(want[:3])) == want[:3]  # nothing to add

"""n > 1 in both sharing modes, block by block: copy-on-write forks (paper / vLLM v0)
against child requests that share through the prefix cache (vLLM v1)."""

import dataclasses

import pytest

from engine.core import CacheConfig, ConfigError, QueueFullError, Scheduler, SchedulerConfig
from engine.events.folds.reducer import PoolState
from engine.events.schema.types import CowCopy, PrefixHit, RequestArrived, RequestForked

from tests.core.driver import make_scheduler, req, run_all, step


def _refs(s, n):
    return [b.ref_count for b in s.kv.pool.blocks[:n]]


def _tables(s):
    return {rid: s.kv.block_ids(rid) for rid in sorted(s.kv.tables)}


def _run_collecting(s):
    """Step dry; returns {core id: output token ids} of every finished request."""
    done = {}
    while s.has_unfinished_requests():
        _, _, finished = step(s)
        for r in finished:
            done[r.request_id] = list(r.output_token_ids)
    return done


def test_cow_forks_share_the_partial_block_then_copy_it():
    s = make_scheduler(block_size=4, num_blocks=16)
    s.add_request(req("a", range(6), max_tokens=3, n=3))  # 1 full block + 2 tokens
    out, children, _ = step(s)
    assert [x.request_id for x in out.scheduled] == ["a"] and out.scheduled[0].num_new_tokens == 6
    assert out.scheduled[0].sample_ids == ("a", "a#1", "a#2")
    assert [c.request_id for c in children] == ["a#1", "a#2"]
    assert _tables(s) == {"a": [0, 1], "a#1": [0, 1], "a#2": [0, 1]}
    assert _refs(s, 4) == [3, 3, 0, 0]
    out, _, _ = step(s)
    # the first two to write into shared block 1 get copies; the last writes in place
    assert out.cow_pairs == [(1, 2), (1, 3)]
    assert _tables(s) == {"a": [0, 2], "a#1": [0, 3], "a#2": [0, 1]}
    assert _refs(s, 5) == [3, 1, 1, 1, 0]
    run_all(s)
    assert s.kv.pool.num_free == 16 and s.log.counts.cow_copies == 2


def test_prefix_cache_children_share_full_blocks_by_hits_and_own_their_partial_block():
    s = make_scheduler(block_size=4, num_blocks=16, n_sharing="prefix_cache")
    entered = s.add_request(req("a", range(6), max_tokens=3, n=3))
    assert [(r.request_id, r.parent_id, r.sample_index, r.params.n) for r in entered] == [
        ("a", None, 0, 1), ("a#1", "a", 1, 1), ("a#2", "a", 2, 1)]
    assert [r.arrival_index for r in entered] == [0, 1, 2]
    assert [r.seed for r in entered] == [entered[0].seed + k for k in range(3)]
    arrived = [e for e in s.log.events if isinstance(e, RequestArrived)]
    assert [(e.request_id, e.parent_id) for e in arrived] == [("a", None), ("a#1", "a"), ("a#2", "a")]
    out = s.schedule()
    # a computes the whole prompt; a#1 and a#2, admitted later in the same step, hit its
    # full block 0 (hashed at schedule) and compute the 2 tokens of their own block
    assert [(x.request_id, x.start_position, x.num_new_tokens, x.block_table, x.sample_ids)
            for x in out.scheduled] == [("a", 0, 6, [0, 1], ("a",)),
                                        ("a#1", 4, 2, [0, 2], ("a#1",)),
                                        ("a#2", 4, 2, [0, 3], ("a#2",))]
    assert out.cow_pairs == [] and [n.request_id for n in out.new_requests] == ["a", "a#1", "a#2"]
    hits = [(e.request_id, e.blocks, e.num_tokens) for e in s.log.events if isinstance(e, PrefixHit)]
    assert hits == [("a#1", (0,), 4), ("a#2", (0,), 4)]
    assert _refs(s, 5) == [3, 1, 1, 1, 0]
    s.update_from_output(out, _sampled(out))
    for _ in range(2):
        out, _, _ = step(s)
        assert out.cow_pairs == []
    assert not any(isinstance(e, (CowCopy, RequestForked)) for e in s.log.events)
    assert s.kv.pool.num_free == 16 and s.log.counts.cow_copies == 0
    assert s.log.counts.prefix_cache_hits == 8


def _sampled(out):
    from tests.core.driver import fake_token, tokens

    return tokens({x.request_id: fake_token("a", int(x.request_id.partition("#")[2] or 0), x.seq_len)
                   for x in out.scheduled})


def test_a_prompt_on_a_block_boundary_costs_prefix_cache_children_a_block_each():
    """The hit never covers the last prompt token, so a v1 child recomputes the last full
    prompt block in a block of its own; a cow fork shares it."""
    cow = make_scheduler(block_size=4, num_blocks=16)
    cow.add_request(req("a", range(8), max_tokens=3, n=2))
    step(cow)
    assert _tables(cow) == {"a": [0, 1], "a#1": [0, 1]}
    step(cow)
    assert _tables(cow) == {"a": [0, 1, 2], "a#1": [0, 1, 3]} and cow.log.counts.cow_copies == 0

    v1 = make_scheduler(block_size=4, num_blocks=16, n_sharing="prefix_cache")
    v1.add_request(req("a", range(8), max_tokens=3, n=2))
    out, _, _ = step(v1)
    assert [(x.request_id, x.start_position, x.num_new_tokens) for x in out.scheduled] == [
        ("a", 0, 8), ("a#1", 4, 4)]
    assert _tables(v1) == {"a": [0, 1], "a#1": [0, 2]}
    # block 2 holds the same tokens as block 1, but is not cached a second time (vLLM
    # does not de-duplicate either): one hash, one block
    assert v1.kv.pool.blocks[1].hash is not None and v1.kv.pool.blocks[2].hash is None
    step(v1)
    assert _tables(v1) == {"a": [0, 1, 3], "a#1": [0, 2, 4]}
    assert _refs(v1, 6) == [2, 1, 1, 1, 1, 0]


@pytest.mark.parametrize("prompt_len", [5, 6, 8, 11])
def test_both_modes_give_each_sample_the_same_tokens_and_free_everything(prompt_len):
    """The driver's fake tokens depend on (request, sample, position) only, as a seeded
    sampler on the same logits does: the two modes must agree sample for sample."""
    got = {}
    for mode in ("cow", "prefix_cache"):
        s = make_scheduler(block_size=4, num_blocks=24, n_sharing=mode)
        s.add_request(req("a", range(prompt_len), max_tokens=6, n=3))
        s.add_request(req("b", range(3, 3 + prompt_len), max_tokens=4, n=2))
        got[mode] = _run_collecting(s)
        assert s.kv.pool.num_free == 24
    assert got["cow"] == got["prefix_cache"]
    assert set(got["cow"]) == {"a", "a#1", "a#2", "b", "b#1"}


def test_reducer_agrees_with_prefix_cache_children_step_by_step():
    s = make_scheduler(block_size=4, num_blocks=10, max_model_len=40, budget=8, max_num_seqs=4,
                       n_sharing="prefix_cache")
    state = PoolState(10, 4)
    s.add_request(req("a", range(7), max_tokens=8, n=3))
    s.add_request(req("b", range(20, 29), max_tokens=6, n=2))
    kinds = set()
    while True:
        events = s.log.drain()
        kinds.update(e.type for e in events)
        state.apply_events(events)
        snap = s.snapshot()
        assert dataclasses.replace(state.to_snapshot(), step=snap.step) == snap
        if not s.has_unfinished_requests():
            break
        step(s)
    assert {"prefix_hit", "request_preempted"} <= kinds  # a small pool: the children compete
    assert not kinds & {"request_forked", "cow_copy"}


def test_prefix_cache_children_are_refused_together():
    s = _scheduler_with_queue(3)
    s.add_request(req("x", range(5)))
    with pytest.raises(QueueFullError, match="its 3 samples"):
        s.add_request(req("a", range(6), n=3))
    assert set(s.requests) == {"x"} and len(s.waiting) == 1  # nothing of "a" entered
    s.add_request(req("b", range(6), n=2))
    assert set(s.requests) == {"x", "b", "b#1"}
    # a child's id already taken refuses the whole request, before anything is entered
    s = _scheduler_with_queue(0)
    s.add_request(req("y#1", range(3)))
    with pytest.raises(ValueError, match="'y#1' is already in use"):
        s.add_request(req("y", range(6), n=2))
    assert set(s.requests) == {"y#1"}


def _scheduler_with_queue(max_waiting):
    return Scheduler(SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_waiting=max_waiting,
                                     n_sharing="prefix_cache"),
                     CacheConfig(block_size=4, num_blocks=16))


def test_n_sharing_is_validated():
    with pytest.raises(ConfigError, match="n_sharing must be one of 'cow', 'prefix_cache'"):
        SchedulerConfig(n_sharing="copy")

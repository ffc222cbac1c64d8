"""SchedulerConfig.policy="fair": clients share seats, the step budget and preemption.

Each test builds the same situation under "fcfs" (vLLM's order) and "fair" and checks
the exact requests each step schedules and preempts.
"""

import random

import pytest

from engine.core import ConfigError, SchedulerConfig

from tests.core.driver import make_scheduler, req, run_all, step


def client_req(client, rid, tokens, **kw):
    r = req(rid, tokens, **kw)
    r.client = client
    return r


def running_ids(s):
    return sorted(r.request_id for r in s.running)


def test_the_policy_is_checked():
    with pytest.raises(ConfigError, match="scheduling_policy must be one of 'fcfs', 'fair'"):
        SchedulerConfig(policy="lottery")


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_a_late_client_takes_a_seat_from_the_client_holding_them_all(policy):
    s = make_scheduler(block_size=4, num_blocks=64, max_num_seqs=4, budget=64, policy=policy)
    for i in range(6):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 4), max_tokens=20))
    out, _, _ = step(s)
    assert [x.request_id for x in out.scheduled] == ["a0", "a1", "a2", "a3"]
    s.add_request(client_req("B", "b0", range(500, 504), max_tokens=20))
    out, _, _ = step(s)
    if policy == "fcfs":  # b0 waits behind a4 and a5 for a seat
        assert out.preempted == []
        assert running_ids(s) == ["a0", "a1", "a2", "a3"]
        assert [r.request_id for r in s.waiting] == ["a4", "a5", "b0"]
    else:  # A's newest runner gives its seat to B, and goes back to the front of waiting;
        # two clients at work: 2 of the 4 sequences each per step, A's oldest first
        assert out.preempted == ["a3"]
        assert [x.request_id for x in out.scheduled] == ["a0", "a1", "b0"]
        assert out.scheduled[-1].phase == "prefill"
        assert running_ids(s) == ["a0", "a1", "a2", "b0"]  # a2 keeps its blocks, waits a step
        assert [r.request_id for r in s.waiting] == ["a3", "a4", "a5"]
        assert s.requests["a3"].num_preemptions == 1
        assert s.kv.block_ids("a3") == []
        # stable: nobody is preempted again while the shares hold
        out, _, _ = step(s)
        assert out.preempted == [] and running_ids(s) == ["a0", "a1", "a2", "b0"]
        assert [x.request_id for x in out.scheduled] == ["a0", "b0", "a1"]


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_waiting_requests_are_admitted_round_robin_across_clients(policy):
    s = make_scheduler(block_size=4, num_blocks=64, max_num_seqs=3, budget=64, policy=policy)
    for i in range(4):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 4), max_tokens=5))
    s.add_request(client_req("B", "b0", range(500, 504), max_tokens=5))
    s.add_request(client_req("B", "b1", range(600, 604), max_tokens=5))
    out, _, _ = step(s)
    admitted = [x.request_id for x in out.scheduled]
    # fair: round robin (a0, b0, a1, ...), and two clients at work get 3 // 2 = 1 sequence each
    assert admitted == (["a0", "a1", "a2"] if policy == "fcfs" else ["a0", "b0"])


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_block_pressure_preempts_the_newest_request_of_the_heaviest_client(policy):
    # 3 of A's requests and one of B's, each 4 prompt tokens in blocks of 4: 4 blocks at
    # admission, one more each time all four cross a block boundary. 7 blocks: the first
    # crossing finds 3 free blocks for 4 requests, so one is preempted.
    s = make_scheduler(block_size=4, num_blocks=7, max_model_len=16, max_num_seqs=8, budget=64,
                       policy=policy)
    for i in range(3):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 4), max_tokens=12))
    s.add_request(client_req("B", "b0", range(500, 504), max_tokens=12))
    preempted = []
    for _ in range(3):
        out, _, _ = step(s)
        preempted += out.preempted
    # fcfs takes the most recent arrival, B's only request; fair takes A's newest
    assert preempted == (["b0"] if policy == "fcfs" else ["a2"])


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_each_client_at_work_gets_an_equal_share_of_the_step_budget(policy):
    s = make_scheduler(block_size=4, num_blocks=64, max_num_seqs=16, budget=8, policy=policy)
    for i in range(6):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 1), max_tokens=30))
    s.add_request(client_req("B", "b0", range(500, 501), max_tokens=30))
    out, _, _ = step(s)
    got = {x.request_id: x.num_new_tokens for x in out.scheduled}
    if policy == "fcfs":  # one budget: all seven one-token prompts
        assert got == {f"a{i}": 1 for i in range(6)} | {"b0": 1}
    else:  # two clients at work: 4 tokens each; B uses 1 and nobody gets its other 3
        assert got == {"a0": 1, "a1": 1, "a2": 1, "a3": 1, "b0": 1}
        assert [r.request_id for r in s.waiting] == ["a4", "a5"]
    s.add_request(client_req("B", "b1", range(600, 610), max_tokens=30))
    out, _, _ = step(s)
    got = {x.request_id: x.num_new_tokens for x in out.scheduled}
    if policy == "fcfs":  # 7 decodes, then the one token left goes to b1's prompt
        assert got == {f"a{i}": 1 for i in range(6)} | {"b0": 1, "b1": 1}
    else:  # A: 4 decodes (a4, a5 still wait); B: its decode and 3 tokens of b1's prompt
        assert got == {"a0": 1, "a1": 1, "a2": 1, "a3": 1, "b0": 1, "b1": 3}
    s.finish_request("b0", s.requests["b0"].status.FINISHED_ABORTED)
    s.finish_request("b1", s.requests["b1"].status.FINISHED_ABORTED)
    out, _, _ = step(s)  # one client again: the whole budget is A's, so all six run
    assert {x.request_id: x.num_new_tokens for x in out.scheduled} == {f"a{i}": 1 for i in range(6)}


def test_two_clients_with_equal_shares_never_preempt_each_other():
    s = make_scheduler(block_size=4, num_blocks=200, max_num_seqs=4, budget=64, policy="fair")
    for i in range(10):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 6), max_tokens=3 + i % 4))
        s.add_request(client_req("B", f"b{i}", range(500 + 10 * i, 506 + 10 * i), max_tokens=2 + i % 5))
    outs = run_all(s)
    assert sum(len(o.preempted) for o in outs) == 0
    for o in outs:  # and every step with both clients waiting ran two of each
        ids = [x.request_id for x in o.scheduled]
        assert abs(sum(i[0] == "a" for i in ids) - sum(i[0] == "b" for i in ids)) <= 2


def _trace(policy, clients, seed):
    """Everything one random workload does, step by step, under ``policy``."""
    rnd = random.Random(seed)
    s = make_scheduler(block_size=4, num_blocks=24, max_model_len=64, budget=24, max_num_seqs=5,
                       policy=policy)
    trace, k = [], 0
    for t in range(400):
        if t < 60 and rnd.random() < 0.5:
            k += 1
            n = rnd.randint(1, 30)
            start = rnd.choice([0, 100, 200])  # shared prefixes: prefix hits too
            s.add_request(client_req(rnd.choice(clients), f"r{k}", range(start, start + n),
                                     max_tokens=rnd.randint(1, 20)))
        if not s.has_unfinished_requests():
            continue
        out, _, fin = step(s)
        trace.append(([(x.request_id, x.num_new_tokens, tuple(x.block_table), tuple(x.slot_mapping)) for x in out.scheduled],
                      list(out.preempted), sorted(r.request_id for r in fin)))
        trace.append([repr(e) for e in s.log.drain()])
    return trace, s


@pytest.mark.parametrize("seed", range(6))
def test_with_one_client_fair_is_exactly_fcfs(seed):
    fcfs, s = _trace("fcfs", ["solo"], seed)
    fair, _ = _trace("fair", ["solo"], seed)
    assert fair == fcfs
    if seed == 0:
        assert s.num_preemptions > 0  # the workload reaches preemption: that path is compared too


@pytest.mark.parametrize("seed", range(4))
def test_fair_with_many_clients_finishes_everything_with_the_pool_intact(seed):
    _, s = _trace("fair", ["A", "B", "C"], seed)
    assert not s.has_unfinished_requests()  # no request left behind, no livelock
    assert not s.running and not s.waiting and not s.kv.tables
    assert s.kv.pool.num_free == s.cache_config.num_blocks

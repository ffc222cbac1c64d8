"""SchedulerConfig.fair_ratio: under "fair", no client's share of a step is more than
``fair_ratio`` times what the lightest client at work could use of it.

Exact scheduled ids and chunk sizes, with and without the bound, from the same
situation: a heavy client A and a light client B."""

import pytest

from engine.config import EngineConfig
from engine.core import ConfigError, SchedulerConfig
from engine.core.fair_share import MIN_CHUNK_TOKENS, StepShares

from tests.core.driver import make_scheduler, step
from tests.core.test_fair_scheduling import client_req


def scheduled(out):
    return {x.request_id: x.num_new_tokens for x in out.scheduled}


def heavy_then_light(ratio, a_prompt=1):
    """A runs six one-token-prompt requests (decoding after the first step); then B's
    single request arrives."""
    s = make_scheduler(block_size=4, num_blocks=128, max_model_len=128, max_num_seqs=16, budget=64,
                       policy="fair", fair_ratio=ratio)
    for i in range(6):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + a_prompt), max_tokens=40))
    step(s)
    s.add_request(client_req("B", "b0", range(500, 504), max_tokens=40))
    return s


@pytest.mark.parametrize("ratio", [0, 2, 3])
def test_a_heavy_client_takes_at_most_ratio_times_the_light_clients_sequences(ratio):
    s = heavy_then_light(ratio)
    out, _, _ = step(s)
    got = scheduled(out)
    assert got["b0"] == 4  # B's whole prompt: its share of tokens is untouched
    # without the bound: an equal part of 16 seats (8), so all six of A's; with it, B could
    # use one sequence, so A gets `ratio`, its oldest (running requests first, then B's admission)
    assert [x.request_id for x in out.scheduled] == [f"a{i}" for i in range(6 if ratio == 0 else ratio)] + ["b0"]
    # every one of A's requests keeps its blocks and seat while it waits a step
    assert sorted(r.request_id for r in s.running) == ["a0", "a1", "a2", "a3", "a4", "a5", "b0"]
    out, _, _ = step(s)  # B decodes now: the same shares, round-robin (each client's oldest first)
    a_ids = [f"a{i}" for i in range(6 if ratio == 0 else ratio)]
    assert [x.request_id for x in out.scheduled] == [a_ids[0], "b0", *a_ids[1:]]


def test_the_bound_lifts_when_the_light_client_leaves():
    s = heavy_then_light(2)
    step(s)
    s.finish_request("b0", s.requests["b0"].status.FINISHED_ABORTED)
    out, _, _ = step(s)  # one client again: "fair" is "fcfs", every seat A's
    assert scheduled(out) == {f"a{i}": 1 for i in range(6)}


def test_a_heavy_clients_prefill_gets_ratio_times_a_chunk_beside_a_decoding_client():
    # B decodes one token a step; A's 100-token prompt arrives. Equal shares would give A
    # 64 // 2 = 32 tokens a step; B could use 1, so A gets 2 x MIN_CHUNK_TOKENS = 32 as
    # well at ratio 2, and MIN_CHUNK_TOKENS at ratio 1.
    for ratio, chunk in ((0, 32), (2, 2 * MIN_CHUNK_TOKENS), (1, MIN_CHUNK_TOKENS)):
        s = make_scheduler(block_size=4, num_blocks=128, max_model_len=128, max_num_seqs=16, budget=64,
                           policy="fair", fair_ratio=ratio)
        s.add_request(client_req("B", "b0", range(500, 502), max_tokens=40))
        step(s)
        s.add_request(client_req("A", "a0", range(100), max_tokens=4))
        chunks = []
        for _ in range(3):
            out, _, _ = step(s)
            got = scheduled(out)
            assert got["b0"] == 1
            chunks.append(got["a0"])
        assert chunks == [chunk] * 3, ratio


def test_only_heavy_clients_keep_equal_shares():
    s = make_scheduler(block_size=4, num_blocks=128, max_model_len=128, max_num_seqs=8, budget=64,
                       policy="fair", fair_ratio=2)
    for i in range(6):
        s.add_request(client_req("A", f"a{i}", range(10 * i, 10 * i + 1), max_tokens=40))
        s.add_request(client_req("B", f"b{i}", range(500 + 10 * i, 501 + 10 * i), max_tokens=40))
    out, _, _ = step(s)
    # both could use 6 sequences: 2 x 6 > 8 // 2, so each gets its equal part, 4
    assert sorted(scheduled(out)) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]


def test_step_shares_arithmetic():
    a = [client_req("A", f"a{i}", range(3), max_tokens=4) for i in range(10)]
    b = [client_req("B", "b0", range(40), max_tokens=4)]
    assert StepShares.split(a, [], 512, 64, ratio=2) is None  # one client: one budget
    sh = StepShares.split(a, b, 512, 64, ratio=0)
    assert sh.seqs == {"A": 32, "B": 32} and sh.tokens == {"A": 256, "B": 256}
    sh = StepShares.split(a, b, 512, 64, ratio=2)
    # B could use 1 sequence and 40 tokens; A 10 and 30: the lightest are 1 and 30
    assert sh.seqs == {"A": 2, "B": 2} and sh.tokens == {"A": 60, "B": 60}


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_the_ratio_is_checked(bad):
    with pytest.raises(ConfigError, match="fair_ratio must be an integer >= 0"):
        SchedulerConfig(fair_ratio=bad)
    with pytest.raises(ConfigError, match="fair_ratio must be an integer >= 0"):
        EngineConfig(fair_ratio=bad)


def test_fair_first_and_fair_iter_agree_with_fair_order():
    import random

    from engine.core.fair_share import fair_first, fair_iter, fair_order

    rng = random.Random(7)
    for _ in range(300):
        reqs = [client_req(rng.choice("ABCD"), f"r{i}", range(2), max_tokens=2)
                for i in range(rng.randint(0, 12))]
        held = {c: rng.randint(0, 4) for c in "ABCD" if rng.random() < 0.7}
        order = fair_order(reqs, held)
        assert list(fair_iter(reqs, held)) == order
        if reqs:
            assert fair_first(reqs, held) is order[0]

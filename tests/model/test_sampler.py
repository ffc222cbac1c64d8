"""Sampler: greedy, seeds, top-k / top-p / min-p filtering and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from engine.model import RowSampling, make_generator, sample


def _logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits()
    out = sample(logits, [RowSampling(temperature=0.0)] * 4)
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 4 and out.top_logprobs == [None] * 4


@pytest.mark.parametrize("rows,vocab", [(1, 7), (16, 49152), (64, 49152)])
def test_greedy_takes_the_first_maximum_as_argmax_does(rows, vocab):
    """Ties (integers drawn from 7 values), NaN (argmax's maximum) and -0.0 == 0.0: the
    greedy answer is exactly torch's argmax, at a decode batch's shape too."""
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randint(-3, 4, (rows, vocab), generator=gen).float()
    logits[logits == 0] = -0.0
    logits[torch.rand(rows, vocab, generator=gen) < 0.3 / vocab] = float("nan")
    logits[0, -1] = float("nan")
    out = sample(logits, [RowSampling(temperature=0.0)] * rows)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_top_k_1_equals_greedy():
    logits = _logits()
    rows = [RowSampling(temperature=1.5, top_k=1, generator=make_generator(i)) for i in range(4)]
    assert sample(logits, rows).token_ids == logits.argmax(-1).tolist()


def test_same_seed_reproduces_regardless_of_batch():
    logits = _logits(rows=1, vocab=1000)

    def draw(seed, batch_extra):
        gen = make_generator(seed)
        tokens = []
        for _ in range(20):
            # The seeded row sits among unseeded rows that change every step.
            batch = torch.cat([logits, _logits(batch_extra, 1000, seed=len(tokens) + 7)])
            rows = [RowSampling(temperature=1.0, generator=gen)]
            rows += [RowSampling(temperature=1.0)] * batch_extra
            tokens.append(sample(batch, rows).token_ids[0])
        return tokens

    assert draw(42, 0) == draw(42, 3)
    assert draw(42, 0) != draw(43, 0)


def test_top_p_keeps_smallest_prefix_reaching_p():
    # probs 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps tokens 0 and 1 only.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = make_generator(0)
    seen = {sample(logits, [RowSampling(top_p=0.7, generator=gen)]).token_ids[0] for _ in range(300)}
    assert seen == {0, 1}
    # A tiny top_p still keeps the most likely token.
    assert sample(logits, [RowSampling(top_p=0.01, generator=gen)]).token_ids == [0]


def test_top_k_and_min_p_filter():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    gen = make_generator(1)
    seen_k = {sample(logits, [RowSampling(top_k=2, generator=gen)]).token_ids[0] for _ in range(300)}
    assert seen_k == {0, 1}
    # min_p 0.4 of max 0.4 -> floor 0.16: tokens with 0.1 are dropped.
    seen_min = {sample(logits, [RowSampling(min_p=0.4, generator=gen)]).token_ids[0] for _ in range(300)}
    assert seen_min == {0, 1, 2}


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    gen = make_generator(3)
    counts = torch.zeros(3)
    for _ in range(2000):
        counts[sample(probs.log()[None], [RowSampling(generator=gen)]).token_ids[0]] += 1
    assert torch.allclose(counts / 2000, probs, atol=0.04)


def test_logprobs_of_sampled_and_top_n():
    logits = _logits(rows=2)
    rows = [RowSampling(temperature=0.0, logprobs=3), RowSampling(temperature=0.0)]
    out = sample(logits, rows)
    logp = torch.log_softmax(logits[0], -1)
    assert math.isclose(out.logprobs[0], logp[out.token_ids[0]].item(), abs_tol=1e-6)
    top = torch.topk(logp, 3)
    assert [t for t, _ in out.top_logprobs[0]] == top.indices.tolist()
    assert all(math.isclose(v, w, abs_tol=1e-6) for (_, v), w in zip(out.top_logprobs[0], top.values.tolist()))
    assert out.logprobs[1] is None and out.top_logprobs[1] is None
    # logprobs=0 means the sampled token's logprob only.
    zero = sample(logits[:1], [RowSampling(temperature=0.7, logprobs=0, generator=make_generator(0))])
    assert zero.top_logprobs == [[]] and zero.logprobs[0] is not None


def test_mixed_greedy_and_random_rows():
    logits = _logits()
    rows = [RowSampling(temperature=0.0), RowSampling(generator=make_generator(5)),
            RowSampling(temperature=0.0), RowSampling(top_k=1, generator=make_generator(6))]
    out = sample(logits, rows)
    argmax = logits.argmax(-1).tolist()
    assert out.token_ids[0] == argmax[0] and out.token_ids[2] == argmax[2]
    assert out.token_ids[3] == argmax[3]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-2),
                                 dict(min_p=1.5), dict(logprobs=-1)])
def test_invalid_settings_rejected(bad):
    with pytest.raises(ValueError):
        RowSampling(**bad)

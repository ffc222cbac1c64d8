"""The prompt feed: a second process makes each prompt's hashes, the same ones a run makes
itself, and a run with it makes every decision the same."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.core import CacheConfig, SchedulerConfig
from engine.core.hashing import get_hasher
from engine.simulate.cost import default_cost
from engine.simulate.prompt_feed import MIN_PROMPT_TOKENS, PromptFeed, worth_a_process
from engine.simulate.prompt_hashes import PromptHashes
from engine.simulate.report import summarize
from engine.simulate.simulation import SimConfig, simulate
from engine.simulate.trace import Trace, read_mooncake

from .helpers import request, system, trace

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_conversation_300.jsonl"


def _made_here(tr: Trace, block_size: int, algo: str):
    hashes = PromptHashes(get_hasher(algo), block_size)
    return [(r.tokens(), hashes(r, r.tokens())) for r in tr.requests]


@pytest.mark.parametrize("block_size,algo", [(16, "sha256"), (48, "sha256"), (32, "sha256_cbor")])
def test_the_feed_gives_the_tokens_and_hashes_a_run_makes(block_size, algo):
    """Mooncake prompts (made from hash ids; remembered blocks sent as numbers when the block
    size divides 512) and prompts a trace holds."""
    moon = read_mooncake(SHIPPED)
    moon = dataclasses.replace(moon, requests=moon.requests[:60])
    held = trace([request(f"r{i}", i * 0.1, system(i % 3, 5) + [7, 8, 9 + i]) for i in range(12)])
    for tr in (moon, held):
        with PromptFeed(tr, block_size, algo) as feed:
            got = list(feed)
        want = _made_here(tr, block_size, algo)
        assert got == want
        assert all(type(t) is int for toks, _ in got for t in toks[:50])  # Python ints, as made here


def test_a_run_with_the_feed_decides_everything_as_one_without():
    tr = read_mooncake(SHIPPED)
    tr = dataclasses.replace(tr, requests=tr.requests[:150])
    cfg = SimConfig(3, "precise-prefix", SchedulerConfig(max_model_len=40_000, max_num_batched_tokens=2048),
                    CacheConfig(block_size=16, num_blocks=4000), default_cost())
    a, b = simulate(tr, cfg, prompt_process=True), simulate(tr, cfg, prompt_process=False)
    assert summarize(a) == summarize(b)
    assert [dataclasses.astuple(t) for t in a.requests] == [dataclasses.astuple(t) for t in b.requests]


def test_a_feed_that_fails_says_why_and_one_left_early_is_stopped():
    tr = read_mooncake(SHIPPED)
    with PromptFeed(tr, 16, "no-such-algo") as feed:
        with pytest.raises(RuntimeError, match="prompt feed stopped early.*no-such-algo"):
            next(iter(feed))
    feed = PromptFeed(tr, 16, "sha256")
    first = next(iter(feed))
    assert len(first[1]) == (len(first[0]) - 1) // 16
    feed.close()  # 299 prompts not read: the child is stopped, not waited for
    assert feed._proc.returncode is not None


def test_only_a_large_trace_is_worth_a_process():
    small = read_mooncake(SHIPPED)
    assert sum(r.num_prompt_tokens for r in small.requests) < MIN_PROMPT_TOKENS
    assert not worth_a_process(small)
    big = dataclasses.replace(small, requests=small.requests * (MIN_PROMPT_TOKENS // 900_000 + 1))
    assert sum(r.num_prompt_tokens for r in big.requests) >= MIN_PROMPT_TOKENS
    import os

    assert worth_a_process(big) == (len(os.sched_getaffinity(0)) >= 2)


@pytest.mark.parametrize("block_size", [16, 32, 48])
def test_the_parent_remembers_the_child_s_blocks_under_the_same_numbers(block_size):
    """``PromptHashes(parts=)`` and ``SharedBlocks.join`` with a memory of 64 blocks, so both
    forget hundreds: every prompt joined equals the hashes made, and a hash seen again is
    the same string object (shared, as in a run that hashes its prompts itself)."""
    from engine.simulate.prompt_hashes import SharedBlocks

    maker, taker = PromptHashes(get_hasher("sha256"), block_size, 64), SharedBlocks(block_size, 64)
    kept, first, same = [], {}, 0
    for tr in read_mooncake(SHIPPED).requests:
        parts: list = []
        tokens = tr.tokens()
        made = maker(tr, tokens, parts)
        if block_size == 48:  # 512 is not a multiple: nothing remembered, a tuple is sent
            assert not parts
            continue
        joined = taker.join(parts, (len(tokens) - 1) // block_size)
        assert joined == made
        kept.append(joined)
        for h in joined:
            same += first.setdefault(h, h) is h
    if block_size != 48:
        assert maker._numbered == taker._numbered > 64 and len(taker._blocks) == 64
        assert maker.num_reused > 1000 and same > len(first) + 1000  # seen again, the same object

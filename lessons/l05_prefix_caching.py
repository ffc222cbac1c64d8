"""Lesson 5: automatic prefix caching — a shared system prompt, sub-block prefixes, block size."""

from __future__ import annotations

from collections import Counter

from engine.events.metrics.step_metrics import MISS_CAUSES
from engine.events.versions import (
    FULL_BLOCK_HASHING, HIT_CAP, LRU_EVICTION, MISS_CAUSE_SPLIT, SCHEDULE_TIME_HASHING,
)

from lessons.base import Answer, Lesson, LessonResult, Question, bars, pct
from lessons.scenario import Req, greedy

BLOCK_SIZE, LONG_PREFIX, SHORT_PREFIX, SWEEP = 16, 40, 12, (8, 16, 32, 64)
USER = ("What is a tide?", "Why is the sky blue?", "How do bees fly?", "What makes bread rise?")
USER_LEN = (14, 18, 12, 20)
CAUSE_OPTIONS = ("cold: never cached", "evicted: cached, then evicted",
                 "partial: the shared part ends inside a block", "disabled: caching is off")

SECTIONS = (
    """**Reusing KV across requests.** Many requests start with the same tokens: a system
prompt, a few-shot preamble, the earlier turns of a chat. Their keys and values are the
same too, so the engine can reuse them instead of recomputing them.""",
    f"""**How the cache finds a prefix.** When a block is full, it gets a hash of
*(parent block's hash, its tokens)*. Chaining the parent makes the hash stand for the
whole prefix up to that block {FULL_BLOCK_HASHING.tag()}. The hash is given when the step
that fills the block is scheduled, so a request admitted later in that same step already
hits it: the step's one forward writes the block's keys and values before any token
attends {SCHEDULE_TIME_HASHING.tag()}. A new request hashes its prompt block by block and
takes the longest run of blocks already in the cache: those become the first entries of
its block table, shared (reference counted), and their tokens are not computed again.
A freed block keeps its hash and stays hittable until the pool needs it back
{LRU_EVICTION.tag()}.

Only *full* blocks are hashed. A hit never covers the last prompt token either, because
the engine needs that token's logits to sample {HIT_CAP.tag()}.""",
    f"""**The scenario.** Four questions arrive one step apart, each after the same
{LONG_PREFIX}-token system prompt, with `block_size` {BLOCK_SIZE}. Then the same four
questions with a shared prefix of only {SHORT_PREFIX} tokens. Finally the first workload
again with block sizes 8, 32 and 64, to see how the hit rate depends on the block size.
Misses are split by cause: *cold* (never cached), *evicted*, *partial* (the block holds
tokens that are not shared, or the unfinished last block) and *disabled*
{MISS_CAUSE_SPLIT.tag()}.""",
)


def _workload(ctx, prefix: list[int]) -> list[Req]:
    return [Req(f"q{i}", prefix + ctx.prompt(text + " ", n), greedy(4), i)
            for i, (text, n) in enumerate(zip(USER, USER_LEN))]


def run(ctx) -> LessonResult:
    system = ctx.prompt("You are a patient teacher. Answer in one short sentence. ", LONG_PREFIX)
    common = dict(num_kv_blocks=1024 // BLOCK_SIZE, max_model_len=128)
    main = ctx.run(f"{LONG_PREFIX}-token system prompt, block_size {BLOCK_SIZE}",
                   _workload(ctx, system), block_size=BLOCK_SIZE, **common)
    short = ctx.run(f"{SHORT_PREFIX}-token shared prefix, block_size {BLOCK_SIZE}",
                    _workload(ctx, system[:SHORT_PREFIX]), block_size=BLOCK_SIZE, **common)
    sweep = {BLOCK_SIZE: main}
    for bs in SWEEP:
        if bs != BLOCK_SIZE:
            sweep[bs] = ctx.run(f"{LONG_PREFIX}-token system prompt, block_size {bs}",
                                _workload(ctx, system), block_size=bs, num_kv_blocks=1024 // bs,
                                max_model_len=128)
    later = [f"q{i}" for i in range(1, len(USER))]  # q0 finds an empty cache
    main_hits = [main.lookups()[r].num_hit_tokens for r in later]
    typical = Counter(main_hits).most_common(1)[0][0]
    short_lk = short.lookups()
    short_hits = sum(short_lk[r].num_hit_tokens for r in later)
    causes = {c: sum(getattr(short_lk[r], f"miss_{c}") for r in later) for c in MISS_CAUSES}
    top = max(MISS_CAUSES, key=lambda c: causes[c])
    rate = {str(bs): t.final("prefix_cache_hit_rate") or 0.0 for bs, t in sorted(sweep.items())}
    answers = {
        "hit_tokens": Answer(
            typical,
            explanation=f"Each later request took {', '.join(map(str, main_hits))} prompt tokens "
            f"from the cache: floor({LONG_PREFIX} / {BLOCK_SIZE}) = {LONG_PREFIX // BLOCK_SIZE} "
            f"full blocks. The last {LONG_PREFIX % BLOCK_SIZE} system-prompt tokens share a "
            "block with the question, so that block's hash differs and it is computed again."),
        "sub_block": Answer(
            short_hits,
            explanation=f"With a {SHORT_PREFIX}-token shared prefix, the first block "
            f"({BLOCK_SIZE} tokens) already holds the question, so no block of a later request "
            f"matches a cached one: {short_hits} hit tokens. The later requests' misses: "
            + ", ".join(f"{causes[c]} {c}" for c in MISS_CAUSES)
            + " tokens. A hit rate of 0% with a shared prompt is the classic sign of a prefix "
            "shorter than one block (vLLM issue #54607)."),
        "why": Answer(
            causes, option=CAUSE_OPTIONS[MISS_CAUSES.index(top)],
            explanation=f"The lookups counted {causes[top]} of the missed tokens as {top}: "
            + ("a cached block starts with the same tokens but the request diverges inside it."
               if top == "partial" else "see the miss breakdown chart.")),
    }
    breakdown = {
        "hit": [main.final("prefix_cache_hits", 0), short.final("prefix_cache_hits", 0)],
        **{c: [t.final(f"prefix_cache_miss_{c}", 0) for t in (main, short)] for c in MISS_CAUSES},
    }
    charts = [
        bars("Prefix-cache hit rate against block size", list(rate),
             {"hit rate (%)": [round(100 * v, 1) for v in rate.values()]}, x_label="block_size",
             y_label="% of prompt tokens", note=f"{LONG_PREFIX}-token system prompt; hits come in "
             "whole blocks, so they shrink as blocks grow"),
        bars("Prompt tokens by outcome (all requests)",
             [f"{LONG_PREFIX}-token prefix", f"{SHORT_PREFIX}-token prefix"], breakdown,
             y_label="tokens"),
    ]
    focus = main.first_token_step("q1")
    facts = {"hit_tokens_per_later_request": main_hits, "sub_block_hit_tokens": short_hits,
             "sub_block_miss_causes": causes, "hit_rate_by_block_size": {k: pct(v) for k, v in rate.items()}}
    return LessonResult(answers, charts, (main, focus), facts)


QUESTIONS = (
    Question("hit_tokens", f"Four requests start with the same {LONG_PREFIX}-token system prompt "
             f"(block_size {BLOCK_SIZE}). How many prompt tokens does each later request take "
             "from the cache?"),
    Question("sub_block", f"Now the shared prefix is only {SHORT_PREFIX} tokens. How many prompt "
             "tokens hit the cache, over all later requests?"),
    Question("why", "What does the engine give as the cause of those misses?", CAUSE_OPTIONS),
)

LESSON = Lesson(
    number=5, slug="prefix-caching", title="Automatic prefix caching",
    short="prefix caching", sections=SECTIONS, questions=QUESTIONS,
    takeaway="The prefix cache reuses whole blocks of a shared prefix, found by chained "
    "hashes. A shared prefix is reused only up to its last full block, so one shorter than "
    "a block is never reused, and bigger blocks reuse less.",
    run=run, models=(FULL_BLOCK_HASHING, SCHEDULE_TIME_HASHING, LRU_EVICTION, HIT_CAP,
                     MISS_CAUSE_SPLIT),
)

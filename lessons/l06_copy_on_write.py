"""Lesson 6: copy-on-write with n > 1 forks — memory saved, copies counted."""

from __future__ import annotations

from engine.core import SamplingParams
from engine.events.types import CowCopy, RequestFinished

from lessons.base import Answer, Lesson, LessonResult, Question, bars, lines
from lessons.scenario import Req

BLOCK_SIZE, PROMPT, N, MAX_TOKENS = 16, 45, 4, 12  # 45 = 2 full blocks + 13 tokens in a third
OPTIONS = ("the forks use fewer", "the same", "the forks use more")

SECTIONS = (
    """**Parallel sampling.** With `n > 1` a request returns several different answers to one
prompt. Every sample needs the prompt's keys and values, and they are identical for all
of them, so computing and storing them `n` times would be waste.""",
    """**Forks share blocks.** kvscope prefills the prompt once, then *forks* the request:
each child's block table is a copy of the parent's, and every block in it gains a
reference (its *ref count* goes up). Nothing is copied yet.

**Copy-on-write.** The samples diverge from their first generated token. Before a
sample writes into a block that others still reference (ref count > 1), the KV cache
manager gives it a fresh block and records a *(source, destination)* pair; the model
runner copies the K/V of that block before the step's forward. The last sample left on
the block writes in place. Full prompt blocks are never written again, so they stay
shared until the end.""",
    f"""**The scenario.** One {PROMPT}-token prompt with `n = {N}` (sampling at temperature
0.8), against the same prompt sent as {N} separate requests. `block_size` {BLOCK_SIZE},
so the prompt fills 2 blocks and 13 slots of a third. Prefix caching is off in both
runs, so only forking shares anything.""",
)


def _sampled(seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.8, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)


def run(ctx) -> LessonResult:
    prompt = ctx.prompt("Write a one-line poem about the sea. ", PROMPT)
    common = dict(block_size=BLOCK_SIZE, num_kv_blocks=32, max_model_len=128,
                  enable_prefix_caching=False)
    fork = ctx.run(f"n={N} forks", [Req("poem", prompt, _sampled(7, N))], **common)
    sep = ctx.run(f"{N} separate requests",
                  [Req(f"poem{i}", prompt, _sampled(7 + i)) for i in range(N)], **common)
    peak = {"fork": fork.peak("num_used_blocks"), "separate": sep.peak("num_used_blocks")}
    copies = fork.final("cow_copies", 0)
    cow_step = fork.first_step(CowCopy)
    # Blocks every sample still shares: ref count N just before the first sample finishes.
    last_full = fork.first_step(RequestFinished) - 1
    snap = fork.snapshot_at(last_full)
    shared_all = sorted(b.id for b in snap.blocks if b.ref_count == N)
    o = OPTIONS
    peak_opt = o[0] if peak["fork"] < peak["separate"] else o[1] if peak["fork"] == peak["separate"] else o[2]
    answers = {
        "peak": Answer(
            peak, option=peak_opt,
            explanation=f"At peak the {N} forks held {peak['fork']} blocks and the {N} separate "
            f"requests {peak['separate']}: the forks saved {peak['separate'] - peak['fork']} blocks "
            f"({100 * (1 - peak['fork'] / peak['separate']):.0f}%). Separate requests each store "
            "their own copy of the prompt."),
        "copies": Answer(
            copies,
            explanation=f"{copies} copy-on-write copies, in step {cow_step}: the prompt's partly "
            f"filled third block was shared by all {N} samples; each of the first {N - 1} to "
            "write its first generated token into it got a copy, and the last one wrote in "
            "place (its ref count was down to 1)."),
        "still_shared": Answer(
            len(shared_all),
            explanation=f"Blocks {shared_all} were still referenced by all {N} samples at step "
            f"{last_full}: the prompt's full blocks. Nobody writes into a full block, so it never "
            "needs a copy."),
    }
    charts = [
        lines("KV blocks in use per step", {
            f"n={N} forks": (fork.steps, fork.series("num_used_blocks")),
            f"{N} separate requests": (sep.steps, sep.series("num_used_blocks"))},
            y_label="blocks"),
        bars("Peak blocks and copies", ["peak blocks in use", "copy-on-write copies"], {
            f"n={N} forks": [peak["fork"], copies],
            f"{N} separate requests": [peak["separate"], sep.final("cow_copies", 0)]}),
    ]
    facts = {"peak_blocks": peak, "cow_copies": copies, "blocks_shared_by_all": shared_all}
    return LessonResult(answers, charts, (fork, cow_step), facts)


QUESTIONS = (
    Question("peak", f"At peak, do {N} forked samples (n={N}) use fewer KV blocks than {N} "
             "separate requests with the same prompt?", OPTIONS),
    Question("copies", "How many block copies (copy-on-write) do the forks need?"),
    Question("still_shared", f"Just before the samples finish, how many blocks are still shared "
             f"by all {N} of them?"),
)

LESSON = Lesson(
    number=6, slug="copy-on-write", title="Copy-on-write with n > 1 forks",
    short="copy-on-write", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Forked samples share the prompt's blocks by reference counting and copy a block "
    "only when they would write into a shared one: here just the partly filled last "
    "prompt block, once per extra sample.",
    run=run,
)

"""Lesson 6: n > 1 samples — copy-on-write forks (paper / v0) against vLLM v1's prefix-cache children."""

from __future__ import annotations

from engine.core import SamplingParams
from engine.events.schema.types import CowCopy, RequestFinished, RequestScheduled
from engine.events.versions import COPY_ON_WRITE, PREFIX_CACHE_SAMPLES

from lessons.base import Answer, Lesson, LessonResult, Question, bars, lines, table
from lessons.scenario import Req

BLOCK_SIZE, PROMPT, N, MAX_TOKENS = 16, 45, 4, 12  # 45 = 2 full blocks + 13 tokens in a third
OPTIONS = ("the forks use fewer", "the same", "the forks use more")
FORK, SEP, V1 = f"n={N} forks", f"{N} separate requests", f"n={N} as child requests"  # variants

SECTIONS = (
    """**Parallel sampling.** With `n > 1` a request returns several different answers to one
prompt. Every sample needs the prompt's keys and values, and they are identical for all
of them, so computing and storing them `n` times would be waste.""",
    f"""**Forks share blocks** {COPY_ON_WRITE.tag()}. The engine prefills the prompt once,
then *forks* the request: each child's block table is a copy of the parent's, and every
block in it gains a reference (its *ref count* goes up). Nothing is copied yet.

**Copy-on-write.** The samples diverge from their first generated token. Before a
sample writes into a block that others still reference (ref count > 1), the KV cache
manager gives it a fresh block and records a *(source, destination)* pair; the model
runner copies the K/V of that block before the step's forward. The last sample left on
the block writes in place. Full prompt blocks are never written again, so they stay
shared until the end. This is kvscope's `n_sharing="cow"` (the default).""",
    f"""**vLLM v1 dropped copy-on-write** {PREFIX_CACHE_SAMPLES.tag()}. It runs the `n`
samples as `n` separate child requests (`vllm/v1/engine/parallel_sampling.py`). The first
child's full prompt blocks are hashed when its step is scheduled, so the others, admitted
in the same step, find them in the prefix cache; each child computes the prompt's partial
last block itself, in a block of its own, and no block is ever copied. This is kvscope's
`n_sharing="prefix_cache"` (a setting on the dashboard's Engine page).""",
    f"""**The scenario.** One {PROMPT}-token prompt with `n = {N}` (sampling at temperature
0.8), three ways: as copy-on-write forks; as {N} separate requests with prefix caching
off, so nothing is shared; and as vLLM v1's child requests. `block_size` {BLOCK_SIZE}, so
the prompt fills 2 blocks and 13 slots of a third. Sample k has the same seed in every
run.""",
)


def _sampled(seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.8, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)


def _sharing(t) -> dict:
    """What one run shared: blocks referenced by all N samples and blocks each sample held
    alone, just before the first sample finished; prompt tokens computed; hits; copies."""
    snap = t.snapshot_at(t.first_step(RequestFinished) - 1)
    return {
        "peak_blocks": t.peak("num_used_blocks"),
        "blocks_after_prompt_step": t.series("num_used_blocks")[0],
        "cow_copies": t.final("cow_copies", 0),
        "prefix_hit_tokens": t.final("prefix_cache_hits", 0),
        "prompt_tokens_computed": sum(e.num_tokens for e in t.events(RequestScheduled)
                                      if e.phase == "prefill"),
        "shared_by_all": sorted(b.id for b in snap.blocks if b.ref_count == N),
        "own_blocks": sum(1 for b in snap.blocks if b.ref_count == 1),
        "step": snap.step,
    }


def run(ctx) -> LessonResult:
    prompt = ctx.prompt("Write a one-line poem about the sea. ", PROMPT)
    common = dict(block_size=BLOCK_SIZE, num_kv_blocks=32, max_model_len=128)
    fork = ctx.run(FORK, [Req("poem", prompt, _sampled(7, N))], n_sharing="cow", **common)
    sep = ctx.run(SEP, [Req(f"poem{i}", prompt, _sampled(7 + i)) for i in range(N)],
                  enable_prefix_caching=False, **common)
    v1 = ctx.run(V1, [Req("poem", prompt, _sampled(7, N))], n_sharing="prefix_cache", **common)
    share = {FORK: _sharing(fork), SEP: _sharing(sep), V1: _sharing(v1)}
    f, s1 = share[FORK], share[V1]
    peak = {"fork": f["peak_blocks"], "separate": share[SEP]["peak_blocks"]}
    copies, cow_step = f["cow_copies"], fork.first_step(CowCopy)
    shared_all, last_full = f["shared_by_all"], f["step"]
    same_tokens = fork.outputs["poem"]["token_ids"] == v1.outputs["poem"]["token_ids"]
    partial = PROMPT % BLOCK_SIZE
    later_same = fork.series("num_used_blocks")[1:] == v1.series("num_used_blocks")[1:]
    o = OPTIONS
    peak_opt = o[0] if peak["fork"] < peak["separate"] else o[1] if peak["fork"] == peak["separate"] else o[2]
    answers = {
        "peak": Answer(
            peak, option=peak_opt,
            explanation=f"At peak the {N} forks held {peak['fork']} blocks and the {N} separate "
            f"requests {peak['separate']}: the forks saved {peak['separate'] - peak['fork']} blocks "
            f"({100 * (1 - peak['fork'] / peak['separate']):.0f}%). Separate requests each store "
            "their own copy of the prompt (prefix caching was off for them; with it on they "
            "would share the full blocks, which is exactly what vLLM v1's child requests do)."),
        "copies": Answer(
            copies,
            explanation=f"{copies} copy-on-write copies, in step {cow_step}: the prompt's partly "
            f"filled third block was shared by all {N} samples; each of the first {N - 1} to "
            "write its first generated token into it got a copy, and the last one wrote in "
            f"place (its ref count was down to 1). vLLM v1's child requests made "
            f"{s1['cow_copies']} copies: each had its own partial block from the start."),
        "still_shared": Answer(
            len(shared_all),
            explanation=f"Blocks {shared_all} were still referenced by all {N} samples at step "
            f"{last_full}: the prompt's full blocks. Nobody writes into a full block, so it never "
            f"needs a copy. The child requests shared {s1['shared_by_all']} the same way, "
            "through prefix-cache hits instead of a fork."),
        "v1_after_prompt": Answer(
            s1["blocks_after_prompt_step"],
            explanation=f"After the prompt step vLLM v1's {N} child requests held "
            f"{s1['blocks_after_prompt_step']} blocks against the forks' "
            f"{f['blocks_after_prompt_step']}: {len(s1['shared_by_all'])} full blocks shared "
            f"through the prefix cache ({s1['prefix_hit_tokens']} hit tokens) plus a partial "
            f"block per sample. The forks shared their partial block for one step only: the "
            f"first decode copied it for all but one sample, so "
            + ("from then on both held the same number of blocks"
               if later_same else "later the two runs held different numbers of blocks")
            + f" (peak {f['peak_blocks']} and {s1['peak_blocks']}). What v1 pays instead of "
            f"{copies} copies: each child computes the partial block's {partial} tokens itself, "
            f"{s1['prompt_tokens_computed']} prompt tokens computed against the forks' "
            f"{f['prompt_tokens_computed']}. What it gains: no copy step, block tables that only "
            "ever grow, and one sharing mechanism (the prefix cache) for everything. With the "
            "same seeds the samples were "
            + ("identical token for token." if same_tokens else "not identical (numerics).")),
    }
    charts = [
        lines("KV blocks in use per step", {
            t.variant: (t.steps, t.series("num_used_blocks")) for t in (fork, sep, v1)},
            y_label="blocks"),
        bars("Peak blocks and copies", ["peak blocks in use", "copy-on-write copies"], {
            k: [v["peak_blocks"], v["cow_copies"]] for k, v in share.items()}),
        table("Who shares what", [
            "run", "sharing", "blocks after the prompt step", "peak blocks", "copies",
            "prefix-hit tokens", "prompt tokens computed", "shared by all samples",
            "blocks held alone"], [
            [k, label, v["blocks_after_prompt_step"], v["peak_blocks"], v["cow_copies"],
             v["prefix_hit_tokens"], v["prompt_tokens_computed"], v["shared_by_all"] or "-",
             v["own_blocks"]]
            for (k, v), label in zip(share.items(), (
                f"copy-on-write {COPY_ON_WRITE.tag()}", "none (prefix caching off)",
                f"prefix cache {PREFIX_CACHE_SAMPLES.tag()}"))],
            note="'shared by all' and 'held alone': just before the first sample finished"),
    ]
    facts = {"peak_blocks": peak, "cow_copies": copies, "blocks_shared_by_all": shared_all,
             "sharing": share, "v1_same_tokens_as_forks": same_tokens}
    return LessonResult(answers, charts, (fork, cow_step), facts)


QUESTIONS = (
    Question("peak", f"At peak, do {N} forked samples (n={N}) use fewer KV blocks than {N} "
             "separate requests with the same prompt?", OPTIONS),
    Question("copies", "How many block copies (copy-on-write) do the forks need?"),
    Question("still_shared", f"Just before the samples finish, how many blocks are still shared "
             f"by all {N} of them?"),
    Question("v1_after_prompt", f"vLLM v1 runs the {N} samples as separate requests that share "
             "full prompt blocks through the prefix cache, with no copy-on-write. Right after the "
             f"prompt step, how many blocks do they hold? (The forks hold {-(-PROMPT // BLOCK_SIZE)}.)"),
)

LESSON = Lesson(
    number=6, slug="copy-on-write", title="Copy-on-write forks, and why vLLM v1 dropped them",
    short="copy-on-write", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Forked samples share the prompt's blocks by reference counting and copy a block "
    "only when they would write into a shared one: just the partly filled last prompt block, "
    "once per extra sample. vLLM v1 gets the full blocks shared by the prefix cache anyway, "
    "so it drops copy-on-write and pays with one partial block per sample, computed per "
    "sample.",
    run=run, models=(COPY_ON_WRITE, PREFIX_CACHE_SAMPLES),
)

"""Lesson 8: sizing the KV budget — bytes → blocks → concurrent max_model_len sequences."""

from __future__ import annotations

from engine.core import KVScopeError
from engine.events.schema.types import RequestScheduled
from engine.events.versions import KV_BUDGET

from lessons.base import Answer, Lesson, LessonResult, Question, bars, lines, table
from lessons.scenario import Req, greedy

BLOCK_SIZE, MAX_MODEL_LEN = 16, 64  # 4 blocks per full-length sequence
BUDGET_BLOCKS, TINY_BLOCKS = 10.5, 3
PROMPT, MAX_TOKENS, NUM_REQ = 60, 4, 3  # 60 + 4 = max_model_len: each request needs 4 blocks
PROJECT_LEN, PROJECT_GIB = 2048, (0.25, 1, 4, 16)
TOO_SMALL = ("the engine starts; requests wait or are preempted",
             "the engine refuses to start and says what to change",
             "requests are cut short to fit")

SECTIONS = (
    """**What one block costs.** A block holds `block_size` tokens' keys *and* values in
every layer:

`bytes per block = 2 x layers x kv_heads x head_dim x block_size x bytes per value`

Grouped-query attention (fewer KV heads than query heads) shrinks this; so does a
smaller dtype.""",
    f"""**From a budget to blocks.** The engine turns a memory budget into a block count once,
at start-up: `num_blocks = budget // bytes_per_block`. On a GPU the budget is
`total memory x gpu_memory_utilization` minus what a profiling forward pass at the
largest batch used (weights and activations) {KV_BUDGET.tag()}. On a CPU kvscope takes
`kv_cache_memory` bytes, or an explicit `num_kv_blocks`. Given neither, it takes 1 GiB,
but no more than `max_num_seqs` full-length sequences can use (vLLM reports that
figure at start-up as the "maximum concurrency"), so a tiny model is not handed a pool
nothing ever fills.

**From blocks to sequences.** A sequence of `max_model_len` tokens needs
`ceil(max_model_len / block_size)` blocks, so `num_blocks // that` full-length sequences
fit at once. If not even one fits, the engine refuses to start: a request could then
never finish.""",
    f"""**The scenario.** `block_size` {BLOCK_SIZE}, `max_model_len` {MAX_MODEL_LEN} (4 blocks),
and a budget worth {BUDGET_BLOCKS} blocks of this model. {NUM_REQ} requests each grow to the
full {MAX_MODEL_LEN} tokens; prefix caching is off, so no two of them share a block. Then the
engine is started with a budget of {TINY_BLOCKS} blocks.""",
)


def run(ctx) -> LessonResult:
    per_block = ctx.kv_bytes_per_block(BLOCK_SIZE)
    budget = int(per_block * BUDGET_BLOCKS)
    work = [Req(f"full{i}", ctx.prompt(f"Write a long story, part {i}. ", PROMPT), greedy(MAX_TOKENS))
            for i in range(NUM_REQ)]
    # prefix caching off: the prompts share their chat-template head, and blocks shared
    # through the cache would let more than the budget arithmetic's sequences run at once
    t = ctx.run(f"kv_cache_memory {budget} bytes", work, block_size=BLOCK_SIZE,
                kv_cache_memory=budget, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False)
    num_blocks, engine_per_block = t.config["num_blocks"], t.config["kv_bytes_per_block"]
    per_seq = -(-MAX_MODEL_LEN // BLOCK_SIZE)
    together = max(sum(1 for e in r.events if isinstance(e, RequestScheduled)) for r in t.records)
    try:
        ctx.engine(block_size=BLOCK_SIZE, kv_cache_memory=per_block * TINY_BLOCKS,
                   max_model_len=MAX_MODEL_LEN)
        error, option = None, TOO_SMALL[0]
    except KVScopeError as exc:
        error, option = f"{type(exc).__name__}: {exc}", TOO_SMALL[1]
    f = t.model_facts
    formula = (f"2 x {f['num_layers']} layers x {f['num_kv_heads']} KV heads x {f['head_dim']} "
               f"head dims x {BLOCK_SIZE} tokens x {f['dtype_bytes']} bytes ({f['dtype']})")
    answers = {
        "num_blocks": Answer(
            num_blocks,
            explanation=f"One block costs {formula} = {engine_per_block:,} bytes. "
            f"{budget:,} // {engine_per_block:,} = {budget // engine_per_block}; the engine made "
            f"{num_blocks} blocks (the half block's bytes are left over)."),
        "sequences": Answer(
            together,
            explanation=f"A {MAX_MODEL_LEN}-token sequence needs {per_seq} blocks, so "
            f"{num_blocks} // {per_seq} = {num_blocks // per_seq} fit at once; the run scheduled at "
            f"most {together} requests in one step, and the third waited for blocks."),
        "too_small": Answer(
            {"error": error}, option=option,
            explanation=(f"The engine refused: {error}" if error else
                         "The engine started; a request longer than the pool would never finish.")),
    }
    gib = 1 << 30
    proj_per_seq = -(-PROJECT_LEN // BLOCK_SIZE)
    charts = [
        table("From bytes to sequences", ["quantity", "value"], [
            ["bytes per block", f"{formula} = {engine_per_block:,}"],
            ["KV budget (kv_cache_memory)", f"{budget:,} bytes"],
            ["blocks = budget // bytes per block", num_blocks],
            [f"blocks per {MAX_MODEL_LEN}-token sequence", per_seq],
            ["full-length sequences at once", num_blocks // per_seq],
            [f"budget of {TINY_BLOCKS} blocks", error or "started"]]),
        lines("Requests per step", {
            "running": (t.steps, t.series("num_requests_running")),
            "waiting": (t.steps, t.series("num_requests_waiting"))}, y_label="requests"),
        bars(f"This model: {PROJECT_LEN}-token sequences that fit in a KV budget",
             [f"{g:g} GiB" for g in PROJECT_GIB],
             {"sequences": [int(g * gib) // engine_per_block // proj_per_seq for g in PROJECT_GIB]},
             x_label="KV budget", y_label="sequences",
             note=f"same arithmetic with max_model_len {PROJECT_LEN}, block_size {BLOCK_SIZE}"),
    ]
    facts = {"kv_bytes_per_block": engine_per_block, "budget_bytes": budget,
             "num_blocks": num_blocks, "full_length_sequences": together, "too_small_error": error}
    return LessonResult(answers, charts, (t, t.steps[0]), facts)


QUESTIONS = (
    Question("num_blocks", f"The KV budget is worth {BUDGET_BLOCKS} blocks of this model. "
             "How many blocks does the engine create?"),
    Question("sequences", f"max_model_len is {MAX_MODEL_LEN} tokens and block_size "
             f"{BLOCK_SIZE}. How many full-length requests can run at once?"),
    Question("too_small", f"What happens with a budget of only {TINY_BLOCKS} blocks?", TOO_SMALL),
)

LESSON = Lesson(
    number=8, slug="kv-budget", title="Sizing the KV budget",
    short="KV budget", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Memory budget // bytes per block = blocks; blocks // blocks per max_model_len "
    "sequence = the sequences guaranteed to fit at once. The engine checks this at start-up "
    "and refuses a pool that cannot hold even one.",
    run=run, models=(KV_BUDGET,),
)

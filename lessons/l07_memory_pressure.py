"""Lesson 7: memory pressure — LRU eviction and preemption by recompute on a small pool."""

from __future__ import annotations

from engine.events.schema.types import (
    BlockAllocated, BlockCached, BlockEvicted, RequestFinished, RequestPreempted,
)

from engine.events.versions import HASHLESS_FIRST, LRU_EVICTION, PREEMPT_NEWEST, TAIL_FIRST_FREE

from lessons.base import Answer, Lesson, LessonResult, Question, lines, table
from lessons.scenario import Req, greedy

BLOCK_SIZE, SMALL, BIG, MAX_MODEL_LEN = 8, 12, 64, 64
WARM = 24  # the first request's prompt: exactly 3 full blocks, all cached when it finishes
PROMPTS, MAX_TOKENS = (22, 20, 18, 16), 12  # each grows to 4 blocks: 16 > 12 blocks in the pool
TOPICS = ("owls", "maps", "tea", "clocks")
EVICT = ("its first block (the start of its prompt)", "a middle block",
         "its last block (the end of its prompt)")
VICTIM = ("the one that arrived last", "the one that arrived first", "another one")
SAME = ("yes, token for token", "no, they differ")

SECTIONS = (
    f"""**When the pool runs out.** Paging lets a server admit requests without reserving
their whole future length, but then the pool can run out while they grow. The engine has
two ways to get blocks back.

**Eviction.** A finished request's full blocks keep their hashes and sit in the *free
queue*, still hittable by the prefix cache. The queue is LRU: a block freed long ago is
reused first, and reusing a cached block drops its hash (an *eviction*)
{LRU_EVICTION.tag()}. Blocks without a hash are reused before any cached one
{HASHLESS_FIRST.tag()}. A request's blocks are freed tail first, so its last block is
evicted before its first: the start of a prompt (a system prompt, say) is the part most
likely to be shared, so it is kept longest {TAIL_FIRST_FREE.tag()}.""",
    f"""**Preemption by recompute.** When a running request needs a block and none is free,
the scheduler *preempts* the most recently arrived running request: it frees all its
blocks and puts it back at the front of the waiting queue {PREEMPT_NEWEST.tag()}. Later the
request is prefilled again from its prompt *and the tokens it had already generated*, so
nothing is lost but compute.

**Does recompute change the output?** In exact arithmetic, no, and the run below
checks it token for token on its device (on kvscope's CPU build it holds). On GPUs it
can: the recompute runs the same tokens as one long prefill instead of one-token decodes,
in a batch of another shape, and kernels whose reduction order depends on the batch
shape (split-K matmuls, split attention, fp16/bf16 rounding) can move a logit in its last
bits, enough to flip a greedy token that was a near tie; from there the text differs.
vLLM makes no batch-invariance promise by default; its `VLLM_BATCH_INVARIANT=1` mode
(beta, recent GPUs) is there for callers that need one.""",
    f"""**The scenario.** A pool of {SMALL} blocks of {BLOCK_SIZE} slots. First one request with a
{WARM}-token prompt runs and finishes; its 3 full blocks stay cached. Then four requests
arrive that will each need 4 blocks ({len(PROMPTS)} x 4 = 16 > {SMALL}). The same workload also
runs on a pool of {BIG} blocks, where nothing is evicted or preempted, to compare outputs.""",
)


def run(ctx) -> LessonResult:
    work = [Req("warm", ctx.prompt("A long shared preamble about gardens. ", WARM), greedy(1))]
    work += [Req(f"p{i}", ctx.prompt(f"Tell me a fact about {t}. ", n), greedy(MAX_TOKENS), 1)
             for i, (t, n) in enumerate(zip(TOPICS, PROMPTS))]
    common = dict(block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN)
    small = ctx.run(f"{SMALL}-block pool", work, num_kv_blocks=SMALL, **common)
    big = ctx.run(f"{BIG}-block pool", work, num_kv_blocks=BIG, **common)

    # The finished request's cached blocks, by hash (a block id is reused by others later).
    warm_table = {e.block: e.logical_index for e in small.events(BlockAllocated)
                  if e.request_id == "warm"}
    done = small.first_step(RequestFinished, lambda e: e.request_id == "warm")
    warm_hash = {e.hash: warm_table[e.block] for e in small.events(BlockCached)
                 if e.step <= done and e.block in warm_table}
    evictions = small.events(BlockEvicted)
    ev_order = [warm_hash[e.hash] for e in evictions if e.hash in warm_hash]
    first_ev = next(e for e in evictions if e.hash in warm_hash)
    idx, last = ev_order[0], max(warm_hash.values())
    evict_opt = EVICT[0] if idx == 0 else EVICT[2] if idx == last else EVICT[1]

    pre = small.events(RequestPreempted)
    first_pre = pre[0]
    states = dict(small.states())
    before = states.get(first_pre.step - 1)
    running = [(r.arrival_index, rid) for rid, r in (before.requests.items() if before else ())
               if r.status == "running"]
    newest, oldest = max(running)[1], min(running)[1]
    victim_opt = VICTIM[0] if first_pre.request_id == newest else \
        VICTIM[1] if first_pre.request_id == oldest else VICTIM[2]

    rids = [r.request_id for r in work]
    same = {rid: small.outputs[rid]["token_ids"] == big.outputs[rid]["token_ids"] for rid in rids}
    device = str(small.config.get("device", "cpu"))
    n_pre, n_ev = small.final("num_preemptions", 0), small.final("num_evictions", 0)
    answers = {
        "evict_first": Answer(
            {"first_evicted_block": first_ev.block,
             "logical_index": idx, "eviction_order_logical": ev_order},
            option=evict_opt,
            explanation=f"The first eviction was block {first_ev.block} in step {first_ev.step}, "
            f"logical block {idx} of the finished request; its blocks went in the order "
            f"{ev_order} (logical indexes). Freed tail first, the last block reached the "
            "reuse end of the queue first, so the prompt's start stayed cached longest."),
        "victim": Answer(
            {"preempted": first_pre.request_id, "step": first_pre.step,
             "running_then": [rid for _, rid in sorted(running)]},
            option=victim_opt,
            explanation=f"In step {first_pre.step}, with {', '.join(r for _, r in sorted(running))} "
            f"running (in arrival order), {first_pre.request_id} was preempted: first come, first "
            f"served, so the newest request gives way and the oldest keep making progress. "
            f"{n_pre} preemptions and {n_ev} evictions in all."),
        "same_output": Answer(
            {"identical": all(same.values()), "per_request": same, "preemptions": n_pre},
            option=SAME[0] if all(same.values()) else SAME[1],
            explanation=f"With {n_pre} preemptions on the {SMALL}-block pool and none on the "
            f"{BIG}-block pool, the greedy outputs (on {device}) were "
            + ("identical for every request: recompute rebuilt the same KV here. On a GPU, "
               "batch-shape-dependent kernels can change a recomputed greedy token."
               if all(same.values()) else
               f"different for {[r for r, s in same.items() if not s]}: the recompute's "
               "numerics differed from the decodes' (batch-shape-dependent kernels).")),
    }
    events = []
    for r in small.records:
        for e in r.events:
            if isinstance(e, BlockEvicted):
                who = f"(warm's logical block {warm_hash[e.hash]})" if e.hash in warm_hash else ""
                events.append([r.step, "evicted", f"block {e.block} {who}".strip()])
            elif isinstance(e, RequestPreempted):
                events.append([r.step, "preempted", e.request_id])
    charts = [
        lines(f"Requests on the {SMALL}-block pool", {
            "running": (small.steps, small.series("num_requests_running")),
            "preempted (waiting to recompute)": (small.steps, small.series("num_requests_preempted")),
            "waiting": (small.steps, small.series("num_requests_waiting"))}, y_label="requests"),
        lines("KV blocks in use", {
            f"{SMALL}-block pool": (small.steps, small.series("num_used_blocks")),
            f"{BIG}-block pool": (big.steps, big.series("num_used_blocks"))}, y_label="blocks"),
        table("Evictions and preemptions, in order", ["step", "what", "detail"], events[:24]),
    ]
    facts = {"device": device, "preemptions": n_pre, "evictions": n_ev, "first_evicted_logical_index": idx,
             "first_preempted": first_pre.request_id, "greedy_identical": all(same.values()),
             "steps": {"small": len(small.records), "big": len(big.records)}}
    return LessonResult(answers, charts, (small, first_pre.step), facts)


QUESTIONS = (
    Question("evict_first", "When the pool runs short, which of the finished request's cached "
             "blocks is evicted first?", EVICT),
    Question("victim", "A running request needs a block and none is free. Which running request "
             "is preempted?", VICTIM),
    Question("same_output", "Are the greedy outputs the same as on the big pool, where nothing "
             "is preempted?", SAME),
)

LESSON = Lesson(
    number=7, slug="memory-pressure", title="Memory pressure: eviction and preemption",
    short="memory pressure", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Under pressure the engine first reuses free blocks (uncached ones, then cached "
    "ones in LRU order, tails before heads), then preempts the newest running request and "
    "recomputes it later. Preemption costs time; the output is the same in exact arithmetic "
    "(and on this CPU build), but on GPUs batch-shape-dependent numerics can change a "
    "recomputed greedy token.",
    run=run, models=(LRU_EVICTION, HASHLESS_FIRST, TAIL_FIRST_FREE, PREEMPT_NEWEST),
)

"""Lesson 1: why contiguous KV allocation wastes memory (paged against the baseline)."""

from __future__ import annotations

from engine.events.baseline.contiguous import (
    BaselineConfig, Reservation, compare, paged_steps, simulate, trace_from_records,
)

from engine.events.versions import CONTIGUOUS_BASELINE, PAGING

from lessons.base import Answer, Lesson, LessonResult, Question, bars, lines, pct
from lessons.scenario import Req, greedy

BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN = 16, 32, 256  # 512 token slots: two max_model_len regions
# (prompt tokens, max_tokens, arrival step): mixed lengths, staggered, as a server sees them
# (chosen so the contiguous variant shows holes; paged peaks under the 32 blocks)
WORKLOAD = [(24, 8, 0), (98, 20, 2), (84, 24, 5), (26, 8, 5), (50, 16, 6), (34, 8, 9),
            (56, 16, 10), (16, 28, 10)]
TOPICS = ("tides", "volcanoes", "bread", "comets", "bees", "glaciers", "violins", "rivers")

SECTIONS = (
    """**The KV cache.** A transformer attends from each new token to every earlier token,
so the engine keeps each token's *key* and *value* vectors (per layer) instead of
recomputing them. That KV cache grows by one entry per token per layer, and it is
what limits how many requests a server can run at once.""",
    f"""**Contiguous allocation.** Before PagedAttention, servers gave each request one
contiguous region of KV memory, sized up front because nobody knows how long the answer
will be {CONTIGUOUS_BASELINE.tag()}. That wastes memory three ways (the PagedAttention paper's terms):
- *reservation*: slots held for tokens the request will generate later, idle until then;
- *internal fragmentation*: slots reserved for tokens that never come, because the answer
  ends before the size reserved for it (`max_model_len` is the extreme case);
- *external fragmentation*: free slots scattered in holes between regions, so a request
  waits although enough memory is free, just not in one piece.""",
    f"""**Paging.** kvscope splits the pool into fixed-size *blocks* (here 16 token slots)
and hands a request one block at a time, as its tokens arrive {PAGING.tag()}. Any free block fits any
request, so there is no external fragmentation, and the only waste is the unfilled part
of each request's last block.

The scenario: 8 requests with mixed prompt and answer lengths run on a pool of
32 blocks x 16 = 512 slots (prefix caching is off, so no block is shared). The same
trace is then replayed on a simulated contiguous allocator with the same 512 slots,
reserving either `max_model_len` (256) or prompt + `max_tokens` per request.""",
)


def run(ctx) -> LessonResult:
    work = [Req(f"r{i}", ctx.prompt(f"Tell me about {TOPICS[i]}. ", p), greedy(m), a)
            for i, (p, m, a) in enumerate(WORKLOAD)]
    # Prefix caching off: this lesson is about allocation alone (sharing is lesson 5).
    t = ctx.run("paged vs contiguous", work, block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS,
                max_model_len=MAX_MODEL_LEN, max_num_seqs=16, enable_prefix_caching=False)
    max_tokens = {f"r{i}": m for i, (_, m, _) in enumerate(WORKLOAD)}
    summ = compare(t.records, NUM_BLOCKS, BLOCK_SIZE, MAX_MODEL_LEN, max_tokens)
    names = {"paged": "paged (kvscope)", "max_model_len": "contiguous, max_model_len",
             "prompt_plus_max_tokens": "contiguous, prompt + max_tokens"}
    conc = {k: summ[k]["max_concurrency"] for k in names}
    waste = {k: summ[k]["reserved_unused_fraction"] for k in names}
    blocked = summ["prompt_plus_max_tokens"]["steps_blocked_by_fragmentation"]
    ext = summ["prompt_plus_max_tokens"]["mean_external_fragmentation"]

    q = {x.key: x for x in QUESTIONS}
    o = q["concurrency"].options
    best_contig = max(conc["max_model_len"], conc["prompt_plus_max_tokens"])
    conc_opt = o[0] if conc["paged"] > best_contig else o[1] if conc["paged"] == best_contig else o[2]
    o2 = q["waste"].options
    w = waste["paged"]
    waste_opt = o2[0] if w < 0.20 else o2[1] if w <= 0.50 else o2[2]
    answers = {
        "concurrency": Answer(
            conc, option=conc_opt,
            explanation=f"At most {conc['paged']} requests ran at once with paging, "
            f"{conc['max_model_len']} when each reserved max_model_len ({MAX_MODEL_LEN} slots) "
            f"and {conc['prompt_plus_max_tokens']} when each reserved prompt + max_tokens. "
            "Paging only holds the blocks a request has filled so far."),
        "waste": Answer(
            {k: round(v, 4) for k, v in waste.items()}, option=waste_opt,
            explanation=f"Of all reserved slots, {pct(w)} held no token with paging (only the "
            f"partly filled last block of each request), against {pct(waste['max_model_len'])} "
            f"reserving max_model_len and {pct(waste['prompt_plus_max_tokens'])} reserving "
            "prompt + max_tokens (regions hold room for tokens not generated yet, or never)."),
        "external": Answer(
            {"steps_blocked": blocked, "mean_external_fragmentation": round(ext, 4)},
            option=q["external"].options[0 if blocked else 1],
            explanation=(f"In {blocked} steps the next request waited with enough free slots, "
                         "split across holes between regions. " if blocked else
                         "In this trace no request waited only because of holes. ")
            + f"On average {pct(ext)} of the free slots lay outside the largest hole. "
            "Paged blocks never have this problem: any free block will do."),
    }
    cap = NUM_BLOCKS * BLOCK_SIZE
    trace = trace_from_records(t.records, max_tokens)
    paged = paged_steps(t.records, NUM_BLOCKS, BLOCK_SIZE)
    running = {"paged (kvscope)": ([r.step for r in paged], [r.num_running for r in paged])}
    for v in (Reservation.MAX_MODEL_LEN, Reservation.PROMPT_PLUS_MAX_TOKENS):
        rows = simulate(trace, BaselineConfig(cap, MAX_MODEL_LEN, v)).steps
        running[names[v.value]] = ([r.step for r in rows], [r.num_running for r in rows])
    charts = [
        bars("Most requests running at once", list(names.values()),
             {"requests": [conc[k] for k in names]}, y_label="requests"),
        bars("Reserved slots that held no token (whole run)", list(names.values()),
             {"share": [round(100 * waste[k], 1) for k in names]}, y_label="%"),
        lines("Requests running per step (same trace, same 512 slots)", running,
              y_label="requests", note="the contiguous runs take more steps: requests wait for room"),
    ]
    peak_step = t.steps[t.series("num_used_blocks").index(t.peak("num_used_blocks"))]
    facts = {"max_concurrency": conc, "reserved_unused_fraction": answers["waste"].value,
             "contiguous_steps_blocked_by_fragmentation": blocked}
    return LessonResult(answers, charts, (t, peak_step), facts)


QUESTIONS = (
    Question("concurrency", "The 8 requests share 512 token slots (max_model_len 256). "
             "Which allocator runs more of them at the same time?",
             ("paged runs more at once", "the same", "contiguous runs more at once")),
    Question("waste", "With paging, what share of the reserved KV slots holds no token, "
             "over the whole run?", ("under 20%", "20% to 50%", "over 50%")),
    Question("external", "With contiguous prompt + max_tokens reservations, does a request ever "
             "wait although enough slots are free, only not in one piece?", ("yes", "no")),
)

LESSON = Lesson(
    number=1, slug="contiguous", title="Why contiguous allocation wastes memory",
    short="contiguous vs paged", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Reserving KV memory up front, in one piece, wastes it on tokens that may never "
    "come and on holes between regions. Paging allocates a block at a time, as tokens "
    "arrive, so the only waste is less than one block per request, and more requests fit.",
    run=run, models=(CONTIGUOUS_BASELINE, PAGING),
)

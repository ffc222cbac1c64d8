"""Lesson 4: chunked prefill and head-of-line blocking (TTFT with and without chunks)."""

from __future__ import annotations

from engine.events.schema.types import RequestScheduled
from engine.events.versions import LONG_PREFILL_CAP, UNIFIED_SCHEDULE

from lessons.base import (
    Answer, Lesson, LessonResult, Question, bars, lines, lower_same_higher, ms, table,
)
from lessons.scenario import Req, greedy

MAX_MODEL_LEN, LONG, SHORT, NUM_SHORT = 256, 250, 14, 3  # (the texts say "three")
BUDGET, CHUNK = 64, 16  # chunked: 64 tokens a step, at most 16 of them for any one prompt
OPTIONS = ("lower with chunking", "about the same", "higher with chunking")
CAUSES = ("chunking itself", f"the {CHUNK}-token per-request cap")
PLAIN, NOCAP, CAPPED = "no chunking", "chunked, no cap", "chunked prefill"  # run variants

SECTIONS = (
    """**Prefill and decode.** A request's first step computes its whole prompt (the
*prefill*) and yields the first output token; every later step computes one token
(a *decode*). Each engine step has a token budget, `max_num_batched_tokens`, shared by
all the requests it runs. *Time to first token* (TTFT) is how long a request waits
from arrival to its first output token.""",
    f"""**Head-of-line blocking.** Without chunking a prompt must be prefilled in one step,
so the budget must hold a whole `max_model_len` prompt. A long prompt then fills one
step on its own, and the short requests queued behind it wait for that whole step
(and the next) before they see a token.

**Chunked prefill** cuts a long prompt into pieces spread over several steps. There
is no prefill phase in the scheduler: each request just closes the gap between the
tokens it has computed and the tokens it has, and running requests are served before
waiting ones {UNIFIED_SCHEDULE.tag()}. So a long prompt that is already running can
still take a whole step's budget. A per-request cap (`long_prefill_token_threshold`)
bounds its share and leaves the rest of each step for others {LONG_PREFILL_CAP.tag()}.""",
    f"""**The scenario.** A {LONG}-token prompt arrives, with {NUM_SHORT} short {SHORT}-token
prompts right behind it. Run 1: no chunking, budget {MAX_MODEL_LEN} tokens a step.
Run 2: chunked prefill, budget {BUDGET} tokens a step, no cap. Run 3: chunked prefill,
budget {BUDGET}, at most {CHUNK} tokens for any one prompt a step. All runs use the same
model, prompts and pool; runs 2 and 3 tell chunking's cost from the cap's.""",
)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _long_prefill_steps(t) -> list[int]:
    return [e.step for e in t.events(RequestScheduled) if e.request_id == "long" and e.phase == "prefill"]


def run(ctx) -> LessonResult:
    long = ctx.prompt("Summarise this report on coastal erosion and sea walls. ", LONG)
    work = [Req("long", long, greedy(2))]
    work += [Req(f"short{i}", ctx.prompt(f"Say hi number {i}. ", SHORT), greedy(4))
             for i in range(NUM_SHORT)]
    ctx.warm_up()  # TTFT is wall time: first-call costs must not land in any run
    common = dict(block_size=16, num_kv_blocks=64, max_model_len=MAX_MODEL_LEN)
    plain = ctx.run(PLAIN, work, enable_chunked_prefill=False,
                    max_num_batched_tokens=MAX_MODEL_LEN, **common)
    nocap = ctx.run(NOCAP, work, enable_chunked_prefill=True, max_num_batched_tokens=BUDGET,
                    **common)
    chunked = ctx.run(CAPPED, work, enable_chunked_prefill=True,
                      max_num_batched_tokens=BUDGET, long_prefill_token_threshold=CHUNK, **common)
    runs = (plain, nocap, chunked)
    shorts = [f"short{i}" for i in range(NUM_SHORT)]
    ttft = {t.variant: {rid: t.outputs[rid]["ttft_s"] for rid in ["long", *shorts]} for t in runs}
    s_ttft = {t.variant: _mean([ttft[t.variant][r] for r in shorts]) for t in runs}
    l_ttft = {t.variant: ttft[t.variant]["long"] for t in runs}
    s_plain, s_nocap, s_chunk = (s_ttft[v] for v in (PLAIN, NOCAP, CAPPED))
    l_plain, l_nocap, l_chunk = (l_ttft[v] for v in (PLAIN, NOCAP, CAPPED))
    short_step = {t.variant: t.first_token_step("short0") for t in runs}
    long_step = {t.variant: t.first_token_step("long") for t in runs}
    prefill_steps = {t.variant: _long_prefill_steps(t) for t in runs}
    long_steps = len(prefill_steps[CAPPED])
    # what each run did with its budget while the long prompt prefilled
    used = {}
    for t in runs:
        by_step = dict(zip(t.steps, t.series("num_batched_tokens")))
        used[t.variant] = _mean([by_step[s] for s in prefill_steps[t.variant]])
    delay = {"chunking_s": round(l_nocap - l_plain, 4), "cap_s": round(l_chunk - l_nocap, 4)}
    cause = CAUSES[1] if delay["cap_s"] > delay["chunking_s"] else CAUSES[0]
    answers = {
        "short_ttft": Answer(
            {"no_chunking_s": round(s_plain, 4), "chunked_s": round(s_chunk, 4),
             "chunked_no_cap_s": round(s_nocap, 4)},
            option=lower_same_higher(s_chunk, s_plain, OPTIONS),
            explanation=f"The short requests' mean TTFT was {ms(s_plain)} without chunking "
            f"(first token in step {short_step[PLAIN]}: they waited behind the {LONG}-token "
            f"prefill) and {ms(s_chunk)} with chunking and the {CHUNK}-token cap (first token "
            f"in step {short_step[CAPPED]}, alongside the first {CHUNK}-token chunk of the long "
            f"prompt). Chunking without the cap gave {ms(s_nocap)} (step {short_step[NOCAP]}): "
            f"the long prompt, served first as a running request, took the whole {BUDGET}-token "
            "budget until its last chunk."),
        "long_ttft": Answer(
            {"no_chunking_s": round(l_plain, 4), "chunked_s": round(l_chunk, 4),
             "chunked_no_cap_s": round(l_nocap, 4)},
            option=lower_same_higher(l_chunk, l_plain, OPTIONS),
            explanation=f"The long prompt's TTFT went from {ms(l_plain)} to {ms(l_chunk)}: "
            f"its prefill now spans {long_steps} steps. The long request waits longer for its "
            "first token; everyone behind it waits much less."),
        "long_steps": Answer(
            long_steps,
            explanation=f"ceil({LONG} / {CHUNK}) = {-(-LONG // CHUNK)}: the {CHUNK}-token cap "
            f"splits the prompt into {long_steps} chunks, one per step (the engine's "
            f"request_scheduled events, phase prefill). Without the cap, the {BUDGET}-token "
            f"budget alone takes {len(prefill_steps[NOCAP])} steps."),
        "cause": Answer(
            {**delay, "long_first_token_step": long_step,
             "mean_tokens_per_step": {k: round(v, 1) for k, v in used.items()}},
            option=cause,
            explanation=f"Chunking alone (budget {BUDGET}, no cap) moved the long prompt's first "
            f"token from step {long_step[PLAIN]} to step {long_step[NOCAP]} and its TTFT by "
            f"{ms(delay['chunking_s'])}; the cap then moved it to step {long_step[CAPPED]}, "
            f"{ms(delay['cap_s'])} more. With the cap its prefill steps computed "
            f"{used[CAPPED]:.0f} of {BUDGET} budget tokens on average (its {CHUNK} plus the "
            f"short requests' decodes), against {used[NOCAP]:.0f} without: the budget was there, "
            "the cap left it unused once the short requests were done."),
    }
    reqs = ["long", *shorts]
    charts = [
        bars("Time to first token", reqs,
             {k: [round(1000 * v[r], 1) for r in reqs] for k, v in ttft.items()},
             x_label="request", y_label="ms"),
        lines("Tokens computed per step", {
            f"{t.variant}: prefill": (t.steps, t.series("num_prefill_tokens")) for t in runs
        } | {f"{t.variant}: decode": (t.steps, t.series("num_decode_tokens")) for t in runs},
            y_label="tokens", note=f"without chunking step 1 holds the {LONG}-token prefill alone"),
        table("Where the long prompt's first token went", [
            "run", "budget", "per-request cap", "long prefill steps", "long's first token (step)",
            "short0's first token (step)", "mean tokens per long-prefill step"], [
            [t.variant, t.config["max_num_batched_tokens"], cap, len(prefill_steps[t.variant]),
             long_step[t.variant], short_step[t.variant], round(used[t.variant], 1)]
            for t, cap in zip(runs, ("-", "-", CHUNK))]),
    ]
    facts = {"short_ttft_ms": {"no_chunking": round(1000 * s_plain, 1), "chunked": round(1000 * s_chunk, 1),
                               "chunked_no_cap": round(1000 * s_nocap, 1)},
             "long_ttft_ms": {"no_chunking": round(1000 * l_plain, 1), "chunked": round(1000 * l_chunk, 1),
                              "chunked_no_cap": round(1000 * l_nocap, 1)},
             "short_first_token_step": {"no_chunking": short_step[PLAIN], "chunked": short_step[CAPPED],
                                        "chunked_no_cap": short_step[NOCAP]},
             "long_first_token_step": {"no_chunking": long_step[PLAIN], "chunked": long_step[CAPPED],
                                       "chunked_no_cap": long_step[NOCAP]},
             "long_prefill_steps": long_steps,
             "long_prefill_steps_no_cap": len(prefill_steps[NOCAP]),
             "mean_tokens_per_long_prefill_step": {"chunked": round(used[CAPPED], 1),
                                                   "chunked_no_cap": round(used[NOCAP], 1)}}
    return LessonResult(answers, charts, (chunked, short_step[CAPPED]), facts)


QUESTIONS = (
    Question("short_ttft", f"Three short prompts arrive right behind a {LONG}-token prompt. "
             "With chunked prefill, is their time to first token lower, about the same, or higher?",
             OPTIONS),
    Question("long_ttft", "And the long prompt's own time to first token?", OPTIONS),
    Question("long_steps", f"With at most {CHUNK} tokens of one prompt per step, how many steps "
             f"does the {LONG}-token prefill take?"),
    Question("cause", "What delays the long prompt's first token most: chunking itself, or the "
             f"{CHUNK}-token per-request cap?", CAUSES),
)

LESSON = Lesson(
    number=4, slug="chunked-prefill", title="Chunked prefill and head-of-line blocking",
    short="chunked prefill", sections=SECTIONS, questions=QUESTIONS,
    takeaway="A long prompt prefilled in one step makes everyone behind it wait. Chunking "
    "alone does not fix that, since the running long prompt takes the whole budget; a "
    "per-request cap leaves budget for short requests, so their time to first token drops, "
    "while the long request's own first token comes later, mostly because of the cap.",
    run=run, models=(UNIFIED_SCHEDULE, LONG_PREFILL_CAP),
)

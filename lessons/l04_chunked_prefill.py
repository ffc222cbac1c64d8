"""Lesson 4: chunked prefill and head-of-line blocking (TTFT with and without chunks)."""

from __future__ import annotations

from engine.events.types import RequestScheduled

from lessons.base import (
    Answer, Lesson, LessonResult, Question, bars, lines, lower_same_higher, ms,
)
from lessons.scenario import Req, greedy

MAX_MODEL_LEN, LONG, SHORT, NUM_SHORT = 256, 250, 14, 3  # (the texts say "three")
BUDGET, CHUNK = 64, 16  # chunked: 64 tokens a step, at most 16 of them for any one prompt
OPTIONS = ("lower with chunking", "about the same", "higher with chunking")

SECTIONS = (
    """**Prefill and decode.** A request's first step computes its whole prompt (the
*prefill*) and yields the first output token; every later step computes one token
(a *decode*). Each engine step has a token budget, `max_num_batched_tokens`, shared by
all the requests it runs. *Time to first token* (TTFT) is how long a request waits
from arrival to its first output token.""",
    """**Head-of-line blocking.** Without chunking a prompt must be prefilled in one step,
so the budget must hold a whole `max_model_len` prompt. A long prompt then fills one
step on its own, and the short requests queued behind it wait for that whole step
(and the next) before they see a token.

**Chunked prefill** cuts a long prompt into pieces spread over several steps. There
is no prefill phase in the scheduler: each request just closes the gap between the
tokens it has computed and the tokens it has. With a per-request cap
(`long_prefill_token_threshold`), the rest of each step's budget is left for others.""",
    f"""**The scenario.** A {LONG}-token prompt arrives, with {NUM_SHORT} short {SHORT}-token
prompts right behind it. Run 1: no chunking, budget {MAX_MODEL_LEN} tokens a step.
Run 2: chunked prefill, budget {BUDGET} tokens a step, at most {CHUNK} for any one
prompt. Both runs use the same model, prompts and pool.""",
)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def run(ctx) -> LessonResult:
    long = ctx.prompt("Summarise this report on coastal erosion and sea walls. ", LONG)
    work = [Req("long", long, greedy(2))]
    work += [Req(f"short{i}", ctx.prompt(f"Say hi number {i}. ", SHORT), greedy(4))
             for i in range(NUM_SHORT)]
    ctx.warm_up()  # TTFT is wall time: first-call costs must not land in either run
    common = dict(block_size=16, num_kv_blocks=64, max_model_len=MAX_MODEL_LEN)
    plain = ctx.run("no chunking", work, enable_chunked_prefill=False,
                    max_num_batched_tokens=MAX_MODEL_LEN, **common)
    chunked = ctx.run("chunked prefill", work, enable_chunked_prefill=True,
                      max_num_batched_tokens=BUDGET, long_prefill_token_threshold=CHUNK, **common)
    shorts = [f"short{i}" for i in range(NUM_SHORT)]
    ttft = {t.variant: {rid: t.outputs[rid]["ttft_s"] for rid in ["long", *shorts]}
            for t in (plain, chunked)}
    s_plain = _mean([ttft["no chunking"][r] for r in shorts])
    s_chunk = _mean([ttft["chunked prefill"][r] for r in shorts])
    l_plain, l_chunk = ttft["no chunking"]["long"], ttft["chunked prefill"]["long"]
    step_plain = plain.first_token_step("short0")
    step_chunk = chunked.first_token_step("short0")
    long_steps = sum(1 for e in chunked.events(RequestScheduled)
                     if e.request_id == "long" and e.phase == "prefill")
    answers = {
        "short_ttft": Answer(
            {"no_chunking_s": round(s_plain, 4), "chunked_s": round(s_chunk, 4)},
            option=lower_same_higher(s_chunk, s_plain, OPTIONS),
            explanation=f"The short requests' mean TTFT was {ms(s_plain)} without chunking "
            f"(first token in step {step_plain}: they waited behind the {LONG}-token prefill) "
            f"and {ms(s_chunk)} with chunking (first token in step {step_chunk}, alongside the "
            f"first {CHUNK}-token chunk of the long prompt)."),
        "long_ttft": Answer(
            {"no_chunking_s": round(l_plain, 4), "chunked_s": round(l_chunk, 4)},
            option=lower_same_higher(l_chunk, l_plain, OPTIONS),
            explanation=f"The long prompt's TTFT went from {ms(l_plain)} to {ms(l_chunk)}: "
            f"its prefill now spans {long_steps} steps. The long request waits longer for its "
            "first token; everyone behind it waits much less."),
        "long_steps": Answer(
            long_steps,
            explanation=f"ceil({LONG} / {CHUNK}) = {-(-LONG // CHUNK)}: the {CHUNK}-token cap "
            f"splits the prompt into {long_steps} chunks, one per step (the engine's "
            "request_scheduled events, phase prefill)."),
    }
    reqs = ["long", *shorts]
    charts = [
        bars("Time to first token", reqs,
             {k: [round(1000 * v[r], 1) for r in reqs] for k, v in ttft.items()},
             x_label="request", y_label="ms"),
        lines("Tokens computed per step", {
            f"{t.variant}: prefill": (t.steps, t.series("num_prefill_tokens")) for t in (plain, chunked)
        } | {f"{t.variant}: decode": (t.steps, t.series("num_decode_tokens")) for t in (plain, chunked)},
            y_label="tokens", note=f"without chunking step 1 holds the {LONG}-token prefill alone"),
    ]
    facts = {"short_ttft_ms": {"no_chunking": round(1000 * s_plain, 1), "chunked": round(1000 * s_chunk, 1)},
             "long_ttft_ms": {"no_chunking": round(1000 * l_plain, 1), "chunked": round(1000 * l_chunk, 1)},
             "short_first_token_step": {"no_chunking": step_plain, "chunked": step_chunk},
             "long_prefill_steps": long_steps}
    return LessonResult(answers, charts, (chunked, step_chunk), facts)


QUESTIONS = (
    Question("short_ttft", f"Three short prompts arrive right behind a {LONG}-token prompt. "
             "With chunked prefill, is their time to first token lower, about the same, or higher?",
             OPTIONS),
    Question("long_ttft", "And the long prompt's own time to first token?", OPTIONS),
    Question("long_steps", f"With at most {CHUNK} tokens of one prompt per step, how many steps "
             f"does the {LONG}-token prefill take?"),
)

LESSON = Lesson(
    number=4, slug="chunked-prefill", title="Chunked prefill and head-of-line blocking",
    short="chunked prefill", sections=SECTIONS, questions=QUESTIONS,
    takeaway="A long prompt prefilled in one step makes everyone behind it wait. Chunked "
    "prefill spreads it over steps and leaves budget for short requests, so their time to "
    "first token drops, while the long request's own first token comes later.",
    run=run,
)

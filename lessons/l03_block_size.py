"""Lesson 3: the block_size trade-off — a sweep over 8, 16, 32 and 64."""

from __future__ import annotations

from engine.events.versions import FULL_BLOCK_HASHING, PAGING

from lessons.base import Answer, Lesson, LessonResult, Question, argmax_option, bars, pct
from lessons.scenario import Req, greedy

SIZES = (8, 16, 32, 64)
SLOTS, MAX_MODEL_LEN = 1024, 128  # the same token capacity at every block size
# 67-77 tokens a request: 5, 5, 3 and 2 blocks at sizes 8..64, so the last-block waste shows
SYSTEM, SUFFIXES, MAX_TOKENS = 40, (24, 30, 34), 4
QUESTIONS_ASKED = ("What is a tide?", "Why is the sky blue?", "How do bees fly?")

SECTIONS = (
    f"""**One knob, three effects.** `block_size` is how many token slots one KV block holds
{PAGING.tag()}. It is fixed when the engine starts (it shapes the KV tensors), and it
trades off:
- *internal fragmentation*: a request's last block is on average half empty, so bigger
  blocks waste more slots per request;
- *hit granularity*: the prefix cache hashes and matches only whole blocks, so a shared
  prefix is reused in multiples of `block_size`, rounded down {FULL_BLOCK_HASHING.tag()};
- *kernel efficiency*: on a GPU, bigger blocks mean fewer table lookups and longer
  contiguous reads per block, so attention tends to run faster (up to a point).""",
    """**The sweep.** The same 3 requests run four times, with `block_size` 8, 16, 32 and 64
and the same 1024 token slots each time (128, 64, 32 and 16 blocks). Every request starts
with the same 40-token system prompt, then a different question, and generates 4 tokens.
Requests arrive one step apart, so each finds the earlier ones' blocks in the cache.""",
)


def run(ctx) -> LessonResult:
    system = ctx.prompt("You are a patient teacher. Answer in one short sentence. ", SYSTEM)
    work = [Req(f"q{i}", system + ctx.prompt(q + " ", n), greedy(MAX_TOKENS), i)
            for i, (q, n) in enumerate(zip(QUESTIONS_ASKED, SUFFIXES))]
    ctx.warm_up()  # the first run must not pay for first-call costs in its throughput
    traces = {bs: ctx.run(f"block_size {bs}", work, block_size=bs, num_kv_blocks=SLOTS // bs,
                          max_model_len=MAX_MODEL_LEN) for bs in SIZES}
    frag = {str(bs): t.mean("internal_fragmentation") for bs, t in traces.items()}
    hits = {str(bs): t.final("prefix_cache_hits", 0) for bs, t in traces.items()}
    tput = {str(bs): t.throughput() for bs, t in traces.items()}
    per_req = {str(bs): sorted({e.num_hit_tokens for rid, e in t.lookups().items() if rid != "q0"})
               for bs, t in traces.items()}
    q = {x.key: x for x in QUESTIONS}
    answers = {
        "waste": Answer(
            {k: round(v, 4) for k, v in frag.items()},
            option=argmax_option(frag, q["waste"].options),
            explanation="Mean share of allocated slots left empty: "
            + ", ".join(f"{pct(v)} at {k}" for k, v in frag.items())
            + ". Each request's last block is partly empty, and a bigger block has more "
            "room to be empty."),
        "hits": Answer(
            hits, option=argmax_option({k: float(v) for k, v in hits.items()}, q["hits"].options),
            explanation="Prompt tokens served from the cache, all requests: "
            + ", ".join(f"{v} at {k}" for k, v in hits.items())
            + f". Each later request reuses floor({SYSTEM} / block_size) whole blocks of the "
            f"{SYSTEM}-token system prompt: "
            + ", ".join(f"{'/'.join(map(str, v)) or '0'} tokens at {k}" for k, v in per_req.items())
            + ". With 64-token blocks the prompt never fills a block, so nothing can hit."),
    }
    charts = [
        bars("Internal fragmentation (mean over steps)", list(frag),
             {"empty share of allocated slots (%)": [round(100 * v, 1) for v in frag.values()]},
             x_label="block_size", y_label="%"),
        bars("Prefix-cache hits (prompt tokens reused)", list(hits),
             {"hit tokens": list(hits.values())}, x_label="block_size", y_label="tokens"),
        bars("Decode throughput", list(tput), {"tokens/s": [round(v, 1) for v in tput.values()]},
             x_label="block_size", y_label="output tokens / s",
             note="on a CPU and a tiny batch this is mostly noise; on a GPU larger blocks "
             "make the attention kernel's reads longer and fewer"),
    ]
    t16 = traces[16]
    focus = t16.steps[t16.series("num_used_blocks").index(t16.peak("num_used_blocks"))]
    facts = {"internal_fragmentation": answers["waste"].value, "hit_tokens": hits,
             "throughput_tps": {k: round(v, 1) for k, v in tput.items()}}
    return LessonResult(answers, charts, (t16, focus), facts)


QUESTIONS = (
    Question("waste", "Which block size leaves the largest share of allocated slots empty?",
             tuple(str(s) for s in SIZES)),
    Question("hits", f"All requests share a {SYSTEM}-token system prompt. Which block size "
             "reuses the most prompt tokens from the cache?", tuple(str(s) for s in SIZES)),
)

LESSON = Lesson(
    number=3, slug="block-size", title="The block_size trade-off",
    short="block_size sweep", sections=SECTIONS, questions=QUESTIONS,
    takeaway="Small blocks waste less and share prefixes at a finer grain; large blocks are "
    "kinder to GPU kernels. 16 is the usual compromise (vLLM's default).",
    run=run, models=(PAGING, FULL_BLOCK_HASHING),
)

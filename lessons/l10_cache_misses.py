"""Lesson 10: why is my prefix cache not hitting? The block floor, partial blocks,
eviction under pressure, and token against block occupancy.

Lesson 5 showed that a shared prefix shorter than a block is never reused. This lesson
starts from the report behind it (vLLM #54607: a 0% hit rate that was right), walks the
prefix length across the block boundaries, then follows the two other reasons a shared
prefix misses (the partial last block of a conversation turn; eviction under pressure),
and ends with what the usage gauge does and does not say about a cache of partial blocks
(vLLM PR #57336). Every answer is computed from the runs on the real engine; the token
occupancy is checked against a fold of the recorded events and against the bound an
attached engine's events allow (``engine.events.metrics.occupancy``).
"""

from __future__ import annotations

from engine.events.folds.reducer import PoolState
from engine.events.metrics.occupancy import TokenUsageBound
from engine.events.metrics.step_metrics import MISS_CAUSES
from engine.events.versions import (
    BLOCK_USAGE, FULL_BLOCK_HASHING, HASHLESS_FIRST, HIT_CAP, LRU_EVICTION, MISS_CAUSE_SPLIT,
    SCHEDULE_TIME_HASHING,
)

from lessons.base import Answer, Lesson, LessonResult, Question, bars, lines, pct, table
from lessons.scenario import Req, greedy

BLOCK_SIZE = 16
PREFIXES = (15, 16, 31, 32)  # shared prefix lengths on both sides of the block boundaries
QUESTIONS_TEXT = ("1. What is a tide?", "2. Why is the sky blue?", "3. How do bees fly?",
                  "4. What makes bread rise?")
QUESTION_LEN = 12
SYSTEM = "You are a careful assistant. Answer briefly and plainly. "
TURN1_PROMPT, TURN1_OUT, TURN2_NEW = 40, 10, 12
PRESSURE_POOL, ROOMY_POOL, SYSTEM_LEN, BURST, BURST_LEN, BURST_OUT = 12, 64, 32, 5, 40, 8
SHORT, LONG, OCC_OUT, OCC_POOL = 17, 62, 3, 32  # #57336's 17-token prompts; blocks stay <= pool

BUG = ("yes: identical prefixes should hit", "no: the shared prefix is shorter than a block",
       "no: the cached blocks were evicted")
CAUSES = ("cold: never cached", "evicted: cached, then reused for other requests",
          "partial: the prefix ends inside a block")
FILL = ("over 90%: nearly full", "between 50% and 90%", "under 50%")

SECTIONS = (
    f"""**"My hit rate is 0%."** A user of vLLM put the same system prompt in front of every
request and read a prefix-cache hit rate of 0% (vLLM #54607). Nothing was broken. The cache
keeps *full blocks* only, each found by a hash chained to its parent's
{FULL_BLOCK_HASHING.tag()}, so a shared prefix is reused up to its last full block and not a
token further; lesson 5 showed a 12-token prefix getting nothing. Here the prefix grows
across the boundaries, {', '.join(map(str, PREFIXES))} tokens with `block_size`
{BLOCK_SIZE}, to see the floor exactly. A hit also never covers a prompt's last token,
whose logits are needed {HIT_CAP.tag()}.""",
    f"""**Partial blocks in a conversation.** The second turn of a chat sends the first
turn's prompt and answer back, then a new question. Blocks filled by generated tokens are
hashed too, when the step that fills them is scheduled {SCHEDULE_TIME_HASHING.tag()}. So
what of turn 1 comes back from the cache: its prompt, its answer, or whole blocks of both?
Turn 1 here has a {TURN1_PROMPT}-token prompt and a {TURN1_OUT}-token answer; turn 2 adds a
{TURN2_NEW}-token question. (The answer's last token was sampled but never fed back, so
its key and value were never computed.)""",
    f"""**Eviction under pressure.** A freed block keeps its hash and stays hittable, but
only until the pool needs it: blocks without a hash go first, then cached ones, least
recently freed first {HASHLESS_FIRST.tag()} {LRU_EVICTION.tag()}. Request A runs with a
{SYSTEM_LEN}-token system prompt (two full blocks) and finishes. Then a burst of {BURST}
unrelated {BURST_LEN}-token requests, then request B with A's system prompt. On a
{PRESSURE_POOL}-block pool and on a {ROOMY_POOL}-block one. kvscope splits every missed
token by cause: cold, evicted, partial, disabled {MISS_CAUSE_SPLIT.tag()}.""",
    f"""**Token against block occupancy.** vLLM's `kv_cache_usage_perc` counts blocks: a
block with one token counts as a full one, and a freed block that still holds a hash
counts as free {BLOCK_USAGE.tag()}. vLLM PR #57336 measured a saturating stream of 17-token
prompts on `block_size` 16: 66.7% block usage while 36.5% of the token slots held anything.
kvscope knows every block's fill, so it reports both (`kv_cache_usage` and
`kv_token_usage`, and `kvscope_kv_token_usage` in `/metrics`). Here {OCC_POOL} blocks fill
with {SHORT}-token prompts, then with {LONG}-token ones. An attached vLLM tells less: its
KV events name only the full blocks it stored. From those and the usage gauge, token usage
is at least (stored blocks - free blocks) / all blocks, and at most the block usage; the
run checks that bound at every step.""",
)


def _prompt(ctx, head: list[int], text: str, n: int) -> list[int]:
    return head + ctx.prompt(text + " ", n)


def _floor(ctx) -> tuple[dict[int, list[int]], dict[str, int]]:
    """Each later request's hit tokens, per shared prefix length; and the later requests'
    misses by cause with the shortest prefix."""
    system = ctx.prompt(SYSTEM, max(PREFIXES))
    out, causes = {}, {}
    for p in PREFIXES:
        work = [Req(f"q{i}", _prompt(ctx, system[:p], text, QUESTION_LEN), greedy(2), i)
                for i, text in enumerate(QUESTIONS_TEXT)]
        t = ctx.run(f"{p}-token shared prefix", work, block_size=BLOCK_SIZE, num_kv_blocks=64,
                    max_model_len=128)
        later = [t.lookups()[f"q{i}"] for i in range(1, len(QUESTIONS_TEXT))]
        out[p] = [lk.num_hit_tokens for lk in later]
        if p == PREFIXES[0]:
            causes = {c: sum(getattr(lk, f"miss_{c}") for lk in later) for c in MISS_CAUSES}
    return out, causes


def _turns(ctx):
    """Turn 1 alone (for its answer), then turn 1 and turn 2 on one engine."""
    t1 = Req("turn1", ctx.prompt("Tell me how a lighthouse works. ", TURN1_PROMPT), greedy(TURN1_OUT))
    alone = ctx.run("turn 1 alone", [t1], block_size=BLOCK_SIZE, num_kv_blocks=64, max_model_len=128)
    answer = alone.outputs["turn1"]["token_ids"][0]
    t2 = Req("turn2", t1.prompt + answer + ctx.prompt("And in fog? ", TURN2_NEW), greedy(2),
             TURN1_OUT + 2)  # after turn 1 finished
    both = ctx.run("two turns", [t1, t2], block_size=BLOCK_SIZE, num_kv_blocks=64, max_model_len=128)
    return both, answer == both.outputs["turn1"]["token_ids"][0]


def _pressure(ctx, num_blocks: int):
    system = ctx.prompt(SYSTEM, SYSTEM_LEN)
    work = [Req("A", _prompt(ctx, system, "Name a river.", 8), greedy(4))]
    work += [Req(f"burst{i}", ctx.prompt(f"{i} Unrelated chatter about kites and glue. ", BURST_LEN),
                 greedy(BURST_OUT), 6) for i in range(BURST)]
    work.append(Req("B", _prompt(ctx, system, "Name a mountain.", 8), greedy(4), 40))
    return ctx.run(f"{num_blocks}-block pool", work, block_size=BLOCK_SIZE, num_kv_blocks=num_blocks,
                   max_model_len=128)


def occupancy_rows(trace) -> list[dict]:
    """Per step: the engine's figures, the same folded from the events, the stored full
    blocks an attached viewer would know, and the bound they give."""
    n, bs = trace.config["num_blocks"], trace.config["block_size"]
    state, rows = PoolState(n, bs), []
    for r in trace.records:
        state.apply_step(r)
        s = state.summary()
        stored = sum(h is not None for h in state.hash)
        bound = TokenUsageBound.of(n, s.num_used_blocks, stored)
        fig = s.figures()
        rows.append({"step": r.step, "kv_cache_usage": r.metrics["kv_cache_usage"],
                     "kv_token_usage": r.metrics["kv_token_usage"],
                     "folded_kv_cache_usage": fig["kv_cache_usage"],
                     "folded_kv_token_usage": fig["kv_token_usage"],
                     "filled_slots": s.num_filled_slots, "used_blocks": s.num_used_blocks,
                     "stored_blocks": stored, "bound_low": bound.low, "bound_high": bound.high})
    return rows


def _occupancy(ctx, prompt_len: int):
    per = -(-(prompt_len + OCC_OUT - 1) // BLOCK_SIZE)  # blocks a request ends with
    work = [Req(f"r{i:02d}", ctx.prompt(f"{i:02d} tell me something new. ", prompt_len), greedy(OCC_OUT))
            for i in range(OCC_POOL // per)]
    t = ctx.run(f"{prompt_len}-token prompts", work, block_size=BLOCK_SIZE, num_kv_blocks=OCC_POOL,
                max_model_len=128, max_num_batched_tokens=512)
    rows = occupancy_rows(t)
    peak = max(rows, key=lambda x: (x["kv_cache_usage"], -x["step"]))  # the first busiest step
    return t, rows, peak


def run(ctx) -> LessonResult:
    floor, floor_causes = _floor(ctx)
    both, same_answer = _turns(ctx)
    tight, roomy = _pressure(ctx, PRESSURE_POOL), _pressure(ctx, ROOMY_POOL)
    short, short_rows, short_peak = _occupancy(ctx, SHORT)
    long_, long_rows, long_peak = _occupancy(ctx, LONG)

    hits = {str(p): v[0] for p, v in floor.items()}
    bug_opt = (BUG[2] if floor_causes["evicted"] else
               BUG[1] if hits[str(PREFIXES[0])] == 0 and hits[str(BLOCK_SIZE)] > 0 else BUG[0])

    turn2 = both.lookups()["turn2"]
    shared = TURN1_PROMPT + TURN1_OUT
    t2_causes = {c: getattr(turn2, f"miss_{c}") for c in MISS_CAUSES}

    b_tight, b_roomy = tight.lookups()["B"], roomy.lookups()["B"]
    b_causes = {c: getattr(b_tight, f"miss_{c}") for c in MISS_CAUSES}
    top = max(("cold", "evicted", "partial"), key=lambda c: b_causes[c])
    cause_opt = {"cold": CAUSES[0], "evicted": CAUSES[1], "partial": CAUSES[2]}[top]

    def fill(row):  # filled slots / slots of referenced blocks
        return row["filled_slots"] / (row["used_blocks"] * BLOCK_SIZE)

    f = fill(short_peak)
    fill_opt = FILL[0] if f > 0.9 else FILL[1] if f >= 0.5 else FILL[2]
    all_rows = short_rows + long_rows
    folds_match = all(r["kv_token_usage"] == r["folded_kv_token_usage"]
                      and r["kv_cache_usage"] == r["folded_kv_cache_usage"] for r in all_rows)
    bound_holds = all(r["bound_low"] <= r["kv_token_usage"] <= r["bound_high"] for r in all_rows)

    answers = {
        "bug": Answer(
            {"hit_tokens_by_prefix": hits, "miss_causes_15": floor_causes},
            option=bug_opt,
            explanation="Each later request took "
            + ", ".join(f"{hits[str(p)]} tokens with a {p}-token prefix" for p in PREFIXES)
            + f" from the cache: floor(prefix / {BLOCK_SIZE}) whole blocks. At 15 tokens the "
            "first block already holds a token of the question, so its hash is new and nothing "
            "matches: a 0% hit rate, and the right one (vLLM #54607). One token more and a whole "
            "block hits; the 15 tokens past it do nothing until the second block is full. The later "
            f"requests' misses at {PREFIXES[0]} tokens: "
            + ", ".join(f"{floor_causes[c]} {c}" for c in MISS_CAUSES) + " tokens."),
        "turn2": Answer(
            turn2.num_hit_tokens,
            explanation=f"Turn 2 shares its first {shared} tokens with turn 1 ({TURN1_PROMPT} "
            f"prompt + {TURN1_OUT} answer) and took {turn2.num_hit_tokens} from the cache: the "
            f"answer's tokens are cached like the prompt's, but only in full blocks. Turn 1 "
            f"computed {TURN1_PROMPT + TURN1_OUT - 1} tokens (its last sampled token was never fed "
            f"back), {(TURN1_PROMPT + TURN1_OUT - 1) // BLOCK_SIZE} full blocks; the rest sat in "
            f"a partial block that was never hashed. Turn 2's misses: "
            + ", ".join(f"{t2_causes[c]} {c}" for c in MISS_CAUSES) + " tokens"
            + ("" if same_answer else " (turn 1's answer differed between the two runs)") + "."),
        "evicted": Answer(
            {"hits_tight": b_tight.num_hit_tokens, "hits_roomy": b_roomy.num_hit_tokens,
             "miss_causes_tight": b_causes, "evictions_tight": tight.final("num_evictions", 0),
             "peak_blocks_tight": tight.peak("num_used_blocks")},
            option=cause_opt,
            explanation=f"On the {ROOMY_POOL}-block pool B took {b_roomy.num_hit_tokens} tokens "
            f"(A's {SYSTEM_LEN}-token system prompt) from the cache. On the {PRESSURE_POOL}-block "
            f"pool it took {b_tight.num_hit_tokens}: the burst held up to "
            f"{tight.peak('num_used_blocks')} of the {PRESSURE_POOL} blocks, "
            f"{tight.final('num_evictions', 0)} cached blocks were evicted for it"
            + (", A's system prompt among them" if b_causes["evicted"] else "")
            + ", and the engine counted B's misses as "
            + ", ".join(f"{b_causes[c]} {c}" for c in MISS_CAUSES)
            + " tokens. Same prompt, same cache policy: only the pressure differed."),
        "fill": Answer(
            {"block_usage": short_peak["kv_cache_usage"], "token_usage": short_peak["kv_token_usage"],
             "fill_of_used_blocks": f, "step": short_peak["step"],
             "long_prompts": {"block_usage": long_peak["kv_cache_usage"],
                              "token_usage": long_peak["kv_token_usage"]},
             "attached_bound": [short_peak["bound_low"], short_peak["bound_high"]],
             "fold_matches_engine": folds_match, "bound_holds_every_step": bound_holds},
            option=fill_opt,
            explanation=f"At step {short_peak['step']} the {SHORT}-token requests held "
            f"{short_peak['used_blocks']} of {OCC_POOL} blocks: block usage "
            f"{pct(short_peak['kv_cache_usage'])}. They held {short_peak['filled_slots']} tokens "
            f"in {short_peak['used_blocks'] * BLOCK_SIZE} slots: {pct(f)} of the used blocks, and "
            f"token usage {short_peak['filled_slots']} / ({OCC_POOL} x {BLOCK_SIZE}) = "
            f"{pct(short_peak['kv_token_usage'])} of the pool. Each request's first block was full "
            f"and its second held what was left of its prompt. With {LONG}-token prompts the two figures were "
            f"{pct(long_peak['kv_cache_usage'])} and {pct(long_peak['kv_token_usage'])}: the "
            "gap is the workload's shape. An attached viewer, knowing the usage and the "
            f"{short_peak['stored_blocks']} stored full blocks, could bound token usage to "
            f"[{pct(short_peak['bound_low'])}, {pct(short_peak['bound_high'])}]; the fold of the "
            "recorded events gave the engine's figure at "
            + ("every" if folds_match else "NOT every") + " step."),
    }
    causes_tb = [[label, *(getattr(lk, f"miss_{c}") for c in MISS_CAUSES), lk.num_hit_tokens]
                 for label, lk in (("turn 2", turn2), (f"B, {PRESSURE_POOL} blocks", b_tight),
                                   (f"B, {ROOMY_POOL} blocks", b_roomy))]
    charts = [
        bars("Hit tokens of a later request against the shared prefix's length",
             [str(p) for p in PREFIXES], {"hit tokens": list(hits.values())},
             x_label="shared prefix (tokens)", y_label="tokens",
             note=f"block_size {BLOCK_SIZE}: hits come in whole blocks"),
        table("Where the missed tokens went (prompt tokens)",
              ["request", *MISS_CAUSES, "hit"], causes_tb),
        lines(f"{SHORT}-token prompts on {OCC_POOL} blocks: block against token usage (%)", {
            "kv_cache_usage (blocks)": ([r["step"] for r in short_rows],
                                        [round(100 * r["kv_cache_usage"], 2) for r in short_rows]),
            "kv_token_usage (tokens)": ([r["step"] for r in short_rows],
                                        [round(100 * r["kv_token_usage"], 2) for r in short_rows]),
            "attached lower bound": ([r["step"] for r in short_rows],
                                     [round(100 * r["bound_low"], 2) for r in short_rows])},
            y_label="% of the pool",
            note="the lower bound is what KV events (stored full blocks) and the usage gauge allow"),
        table("Busiest step of each workload",
              ["prompts", "block usage", "token usage", "fill of used blocks", "attached bound"],
              [[f"{n}-token", pct(p["kv_cache_usage"]), pct(p["kv_token_usage"]), pct(fill(p)),
                f"{pct(p['bound_low'])} .. {pct(p['bound_high'])}"]
               for n, p in ((SHORT, short_peak), (LONG, long_peak))]),
    ]
    facts = {"hit_tokens_by_prefix": hits, "hit_tokens_of_each_later_request":
             {str(p): v for p, v in floor.items()}, "turn2_hit_tokens": turn2.num_hit_tokens,
             "turn1_answer_same_in_both_runs": same_answer,
             "B_hits": {"tight": b_tight.num_hit_tokens, "roomy": b_roomy.num_hit_tokens},
             "B_miss_causes_tight": b_causes,
             "occupancy": {str(n): {k: p[k] for k in ("step", "kv_cache_usage", "kv_token_usage",
                                                      "filled_slots", "used_blocks", "stored_blocks",
                                                      "bound_low", "bound_high")}
                           for n, p in ((SHORT, short_peak), (LONG, long_peak))},
             "fold_matches_engine": folds_match, "bound_holds_every_step": bound_holds}
    return LessonResult(answers, charts, (short, short_peak["step"]), facts)


QUESTIONS = (
    Question("bug", "Every request starts with the same 15-token system prompt (block_size 16) "
             "and the hit rate reads 0%. Is the cache broken?", BUG),
    Question("turn2", f"Turn 2 resends turn 1's {TURN1_PROMPT}-token prompt and its "
             f"{TURN1_OUT}-token answer, then a new question. How many of its tokens hit the cache?"),
    Question("evicted", f"On the {PRESSURE_POOL}-block pool, B misses A's system prompt. What "
             "cause does the engine give?", CAUSES),
    Question("fill", f"{SHORT}-token prompts fill the pool: block usage reads 100%. What share of "
             "the slots in the used blocks hold a token?", FILL),
)

LESSON = Lesson(
    number=10, slug="cache-misses", title="Why is my prefix cache not hitting?",
    short="cache misses", sections=SECTIONS, questions=QUESTIONS,
    takeaway="A prefix is reused in whole blocks only: a shared prefix shorter than a block "
    "never hits, and the tokens past the last full block (of a prompt or of an answer) are "
    "computed again. Cached blocks are evicted when the pool runs short, so the same prompt "
    "can miss under pressure. Block usage counts blocks, not tokens: with short prompts the "
    "pool reads full while half its slots are empty; kvscope reports both, and an attached "
    "engine's events bound the token figure from below by its stored full blocks "
    f"{BLOCK_USAGE.tag()}.",
    run=run, models=(FULL_BLOCK_HASHING, HIT_CAP, SCHEDULE_TIME_HASHING, HASHLESS_FIRST,
                     LRU_EVICTION, MISS_CAUSE_SPLIT, BLOCK_USAGE),
)

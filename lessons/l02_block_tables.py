"""Lesson 2: blocks and block tables — follow one request's table as it grows."""

from __future__ import annotations

from engine.events.schema.types import BlockAllocated, RequestProgress, RequestScheduled

from engine.events.versions import PAGING

from lessons.base import Answer, Lesson, LessonResult, Question, lines, table
from lessons.scenario import Req, greedy

BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN = 8, 16, 64
PROMPT_A, PROMPT_B, MAX_TOKENS = 13, 11, 20

SECTIONS = (
    """**Blocks.** The KV pool is an array of *physical blocks*, each with `block_size`
token slots (8 here, so you can count along). A block is the unit of allocation:
a request never owns half a block.""",
    f"""**Block tables.** Each request has a *block table*: entry *i* is the physical block
that holds its tokens *i·block_size* to *(i+1)·block_size − 1*. Attention reads a
request's keys and values through its table, so the blocks do not have to sit next
to each other, much as a page table lets a process's memory be scattered in RAM
{PAGING.tag()}.

Token *t* of a request lives in slot `t % block_size` of block `table[t // block_size]`.""",
    """**Growth.** A prompt gets the blocks for its tokens when it is prefilled (all at
once here: each prompt fits in one step). After that the request computes one token per
step, and its table gains a block only when a token crosses into a new block.

The scenario: request A (13-token prompt) and request B (11-token prompt) each
generate 20 tokens side by side on a pool of 16 blocks of 8 slots. Watch A's table.""",
)


def _fmt(tbl: list[int]) -> str:
    return "  ".join(f"{i}->{b}" for i, b in enumerate(tbl)) or "(none)"


def run(ctx) -> LessonResult:
    work = [Req("A", ctx.prompt("The quick brown fox jumps over the lazy dog. ", PROMPT_A),
                greedy(MAX_TOKENS)),
            Req("B", ctx.prompt("Pack my box with five dozen liquor jugs. ", PROMPT_B),
                greedy(MAX_TOKENS))]
    t = ctx.run("A and B side by side", work, block_size=BLOCK_SIZE, num_kv_blocks=NUM_BLOCKS,
                max_model_len=MAX_MODEL_LEN)
    # Follow both tables through the folded pool state, step by step (as Replay does).
    rows, growth, longest, prev = [], {"A": ([], []), "B": ([], [])}, [], {}
    for step, state in t.states():
        now = {rid: list(state.requests[rid].table) for rid in ("A", "B") if rid in state.requests}
        for rid in ("A", "B"):
            growth[rid][0].append(step)
            growth[rid][1].append(len(now.get(rid, [])))
        if "A" in now and len(now["A"]) > len(longest):
            longest = now["A"]
        if now != prev and now:
            a = state.requests.get("A")
            rows.append([step, a.num_computed_tokens if a else "-", _fmt(now.get("A", [])),
                         _fmt(now.get("B", []))])
        prev = now
    first = t.first_step(RequestScheduled, lambda e: e.request_id == "A")
    after_prefill = sum(1 for e in t.events(BlockAllocated) if e.request_id == "A" and e.step == first)
    third = t.first_step(BlockAllocated, lambda e: e.request_id == "A" and e.logical_index == 2)
    computed_at_third = next(e.num_computed_tokens for e in t.events(RequestProgress)
                             if e.request_id == "A" and e.step == third)
    contiguous = all(b2 == b1 + 1 for b1, b2 in zip(longest, longest[1:]))
    q = {x.key: x for x in QUESTIONS}
    answers = {
        "after_prefill": Answer(
            after_prefill,
            explanation=f"{PROMPT_A} tokens need ceil({PROMPT_A}/{BLOCK_SIZE}) = {after_prefill} "
            f"blocks; the last one holds {PROMPT_A - (after_prefill - 1) * BLOCK_SIZE} of its "
            f"{BLOCK_SIZE} slots. The engine gave A {after_prefill} blocks in step {first}."),
        "third_block": Answer(
            computed_at_third,
            explanation=f"A's table got its third block in step {third}, when A's KV reached "
            f"{computed_at_third} tokens: two blocks hold {2 * BLOCK_SIZE} tokens, so token number "
            f"{2 * BLOCK_SIZE + 1} (position {2 * BLOCK_SIZE}) needs block 2."),
        "contiguous": Answer(
            longest, option=q["contiguous"].options[0 if contiguous else 1],
            explanation=f"A's longest table was [{_fmt(longest)}] (logical->physical). "
            + ("The blocks happen to be consecutive here." if contiguous else
               "B took blocks whenever it grew too, so A's blocks are scattered; the table is "
               "what makes that harmless.")),
    }
    charts = [
        lines("Blocks in each request's table", growth, y_label="blocks",
              note="a table grows one block each time a request crosses a multiple of 8 tokens"),
        table("Block tables (logical->physical) at each step where one changed",
              ["step", "A tokens in KV", "A's table", "B's table"], rows),
    ]
    facts = {"blocks_after_prefill": after_prefill, "tokens_at_third_block": computed_at_third,
             "table_A": longest}
    return LessonResult(answers, charts, (t, third), facts)


QUESTIONS = (
    Question("after_prefill", f"A's prompt has {PROMPT_A} tokens and a block holds {BLOCK_SIZE}. "
             "How many blocks are in A's table right after its prefill?"),
    Question("third_block", "A's table grows to 3 blocks. How many of A's tokens are in the KV "
             "cache at that moment?"),
    Question("contiguous", "Are A's physical blocks next to each other in the pool?",
             ("yes, consecutive block ids", "no, scattered")),
)

LESSON = Lesson(
    number=2, slug="block-tables", title="Blocks and block tables",
    short="block tables", sections=SECTIONS, questions=QUESTIONS,
    takeaway="A request's KV lives in fixed-size blocks found through its block table, so it "
    "grows one block at a time, anywhere in the pool. Waste is bounded by one partly filled "
    "block per request.",
    run=run, models=(PAGING,),
)

"""Teaching presets: one click creates a workload that shows one PagedAttention idea.

Every preset is sized from the running engine (the hello's config: pool, block size,
token budget, max_model_len), in tokens counted with the engine's own tokenizer file
(``tokens`` below; without one, in characters with byte-level bounds), so that it
shows its effect and finishes in under a minute on the CPU box with the default
model:

- *shared system prompt*: 8 chats with one system prompt; 7 hit the first one's blocks;
- *long prompt with short ones*: a prompt of at least 3x the step budget, chunked,
  while short requests that started first keep decoding every step;
- *forks*: ``n = 4`` samples of one prompt whose last block is partial (copy-on-write,
  or prefix-cache hits with ``n_sharing="prefix_cache"``);
- *memory pressure*: 1.5x the pool's slots at once: preemption and LRU eviction.

When the engine cannot show a preset's effect in time (a pool too big to fill in a
minute, a budget too big to chunk inside max_model_len, prefix caching off) the
workload says so and carries the restart options that fit (``Workload.restart``).
``estimate_s`` is a cost model from times measured on that box (``PREFILL_TPS``,
``STEP_S``); tests/dashboard/test_presets.py keeps every preset under ``TIME_BUDGET_S``.
A preset is a list of waves: a wave is submitted once every request of the previous
one has its first token (so its prompt blocks are cached and it is running).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events.versions import COPY_ON_WRITE, LONG_PREFILL_CAP, PREEMPT_NEWEST, \
    PREFIX_CACHE_SAMPLES, UNIFIED_SCHEDULE

TEMPLATE_SLACK = 24  # tokens a chat template and BOS may add around the text
# Measured with smollm2-135m on the 2-core CPU box under load (~6): a 512-token prefill
# chunk takes 1.3-4 s (longer as the context grows), a decode step of 8-16 requests
# 0.19-0.3 s. Whole presets measured there: shared prompt 15.8 s, long + short 19.3 s,
# forks 4.8 s, memory pressure 29.5 s on a 512-slot pool (64.7 s with the dashboard and
# a browser beside it: hence the 256-slot pool).
PREFILL_TPS = 150.0
STEP_S = 0.25
TIME_BUDGET_S = 30.0  # estimate per preset: half the minute a learner waits at most
PRESSURE_SLOTS = 256  # a pool this small (in token slots) fills in seconds, even under load
LONG_FACTOR = 3.5  # the long prompt: budgets' worth of tokens (>= 3, so >= 4 chunks)
MAX_LONG_TOKENS = 2400  # a longer prefill alone would take ~10 s on the box
NUM_SHORT = 6

_SYSTEM = (
    "You are a patient teacher of computer systems. Answer in short, plain sentences. "
    "When a question is about memory, explain what is stored, where it lives, who owns it "
    "and when it is freed. Prefer concrete numbers over adjectives, and say so when a "
    "figure is an estimate. Never invent citations; if you do not know, say you do not know. "
    "Keep every answer under one hundred words unless the learner asks for more detail. "
)
_QUESTIONS = (
    "What is a KV cache?", "Why does attention need past keys?", "What is a page table?",
    "Why is memory fragmentation bad?", "What does copy-on-write mean?",
    "What is LRU eviction?", "Why batch requests together?", "What is a token?",
)
_STORY = (
    "The library had one long shelf, and every new book had to be placed on it in one piece. "
    "When a thick book arrived the librarian searched for a gap wide enough, and often there "
    "was room in total but no single gap large enough, so the book waited by the door. "
    "Then someone cut the shelf into equal boxes and wrote, for each book, a list of which "
    "boxes held its chapters. Nothing had to be contiguous any more. "
)
_SHORT = ("Hi!", "Name a color.", "Count to three.", "Say yes.", "One word: sky?", "2+2?")
_FORK = "Once upon a time, in a city built of memory blocks, "


@dataclass(frozen=True, slots=True)
class Submission:
    """One ``submit`` op: ``prompt`` (text) or ``messages`` (chat), and sampling params."""

    params: dict[str, Any]
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A preset sized for one engine. ``effect``: what it must show (the key the effect
    check reads, ``preset_effects``); ``rule``: the engine behaviour at work, labelled
    with the vLLM version it models; ``restart``: options of an engine that shows the
    effect in time (None: this one does); ``estimate_s``: the cost model's time."""

    name: str
    waves: list[list[Submission]] = field(default_factory=list)
    watch: str = ""  # what to look at on the Live page
    effect: str = ""
    rule: str = ""
    restart: dict[str, Any] | None = None
    restart_why: str = ""
    estimate_s: float = 0.0

    @property
    def size(self) -> int:
        return sum(len(w) for w in self.waves)


# ---- the engine's shape and token counts ------------------------------------------

@dataclass(frozen=True, slots=True)
class Shape:
    """The engine options a preset is sized from (fallbacks for a bare config)."""

    max_model_len: int
    num_blocks: int
    block_size: int
    budget: int
    max_num_seqs: int
    chunked: bool
    prefix_caching: bool
    threshold: int
    n_sharing: str

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        mml = int(config.get("max_model_len") or 2048)
        return cls(mml, int(config.get("num_blocks") or 256), int(config.get("block_size") or 16),
                   int(config.get("max_num_batched_tokens") or 512),
                   int(config.get("max_num_seqs") or 16),
                   bool(config.get("enable_chunked_prefill", True)),
                   bool(config.get("enable_prefix_caching", True)),
                   int(config.get("long_prefill_token_threshold") or 0),
                   str(config.get("n_sharing") or "cow"))

    @property
    def capacity(self) -> int:
        return self.num_blocks * self.block_size


class Tokens:
    """Token counts of preset texts: exact with the engine's tokenizer (``count``),
    else bounds in characters (at most one token per UTF-8 byte; at least one per
    ~5 characters of English)."""

    def __init__(self, count: Callable[[str], int] | None = None) -> None:
        self.count = count

    def most(self, text: str) -> int:
        return self.count(text) if self.count else len(text.encode())

    def least(self, text: str) -> int:
        return self.count(text) if self.count else len(text) // 5

    def text(self, source: str, want: int, limit: int) -> str:
        """``source`` repeated until it has at least ``want`` tokens (as far as ``limit``
        tokens allow), cut at a word boundary."""
        words, out = (source * (want // 8 + 2)).split(" "), ""
        lo, hi = 1, len(words)
        while lo < hi:  # the shortest prefix with >= want tokens, within the limit
            mid = (lo + hi) // 2
            t = " ".join(words[:mid])
            if self.least(t) >= want or self.most(t) > limit:
                hi = mid
            else:
                lo = mid + 1
        out = " ".join(words[:lo])
        while " " in out and self.most(out) > limit:
            out = out.rsplit(" ", 1)[0]
        return _cut(self, out, limit)


def _cut(tokens: Tokens, text: str, limit: int) -> str:
    """``text`` shortened (a character at a time) to at most ``limit`` tokens."""
    while len(text) > 1 and tokens.most(text) > limit:
        text = text[:-1]
    return text


def _room(shape: Shape, prompt_tokens: int, want: int) -> int:
    """max_tokens that keeps prompt (worst case) + output within max_model_len (>= 1)."""
    return max(1, min(want, shape.max_model_len - prompt_tokens - TEMPLATE_SLACK))


def estimate_s(prefill_tokens: int, steps: int) -> float:
    """The cost model: prefill throughput plus a per-step time, as measured on the box."""
    return prefill_tokens / PREFILL_TPS + steps * STEP_S


# ---- the presets ---------------------------------------------------------------------

def shared_system_prompt(config: dict[str, Any], tokens: Tokens | None = None) -> Workload:
    shape, tokens = Shape.of(config), tokens or Tokens()
    budget = shape.max_model_len - TEMPLATE_SLACK - 2  # prompt tokens that leave an answer
    q_cap = max(1, min(max(tokens.most(q) for q in _QUESTIONS), budget // 2))
    questions = [_cut(tokens, q, q_cap) for q in _QUESTIONS]
    want = max(2 * shape.block_size, min(320, shape.max_model_len // 3, shape.capacity // 12))
    system = tokens.text(_SYSTEM, want, max(1, min(shape.max_model_len // 2, budget - q_cap)))
    q_tokens = max(tokens.most(q) for q in questions)
    max_tokens = _room(shape, tokens.most(system) + q_tokens, 32)
    subs = [Submission({"max_tokens": max_tokens, "temperature": 0.0},
                       messages=[{"role": "system", "content": system},
                                 {"role": "user", "content": q}]) for q in questions]
    restart = None if shape.prefix_caching else {"enable_prefix_caching": True}
    prefill = tokens.most(system) + 8 * (q_tokens + TEMPLATE_SLACK)
    return Workload(
        "Shared system prompt × 8", [subs[:1], subs[1:]],
        "The first request fills the cache; the other seven hit its full system-prompt "
        "blocks and share them (violet). Watch the prefix hit rate jump.",
        effect="hits",
        rule="Automatic prefix caching: full blocks are hashed with their prefix, and a "
             "new request reuses every leading block whose hash is cached, never the last "
             "prompt token (vLLM v1 (0.x)).",
        restart=restart, restart_why="prefix caching is off" if restart else "",
        estimate_s=estimate_s(prefill, 2 * max_tokens))


def long_with_short(config: dict[str, Any], tokens: Tokens | None = None) -> Workload:
    shape, tokens = Shape.of(config), tokens or Tokens()
    room = 32 + TEMPLATE_SLACK
    limit = min(shape.max_model_len - room, shape.capacity // 2, MAX_LONG_TOKENS)
    budget = shape.budget
    restart: dict[str, Any] | None = None
    why = ""
    if not shape.chunked or LONG_FACTOR * budget > limit:
        budget = max(16, int(limit / LONG_FACTOR) // 16 * 16)
        restart = {"max_num_batched_tokens": budget, "enable_chunked_prefill": True}
        why = ("chunked prefill is off" if not shape.chunked else
               f"a prompt of 3x the {shape.budget}-token budget does not fit "
               f"max_model_len {shape.max_model_len} (and a minute)")
    long_text = tokens.text(_STORY, int(LONG_FACTOR * budget), limit)
    long_tokens = tokens.most(long_text)
    chunks = math.ceil(long_tokens / max(1, budget - NUM_SHORT))
    # the short requests decode through every chunk of the long prompt, and a bit after
    short_max = chunks + 8
    subs_short = [Submission({"max_tokens": _room(shape, tokens.most(s), short_max),
                              "temperature": 0.0, "ignore_eos": True}, prompt=s) for s in _SHORT]
    long_sub = Submission({"max_tokens": _room(shape, long_tokens, 8), "temperature": 0.0},
                          prompt=long_text)
    cap = (f" With long_prefill_token_threshold = {shape.threshold} one request takes at "
           f"most that many tokens per step {LONG_PREFILL_CAP.tag()}." if shape.threshold else
           " Had the long prompt come first, it would fill every step until its prefill "
           "ended and the short ones would wait; long_prefill_token_threshold (Engine page) "
           f"caps what one request takes per step {LONG_PREFILL_CAP.tag()}.")
    return Workload(
        "One long prompt with short ones", [subs_short, [long_sub]],
        f"Chunked prefill: the {long_tokens}-token prompt (≥ 3× the {budget}-token step "
        "budget) is split over several steps, and the short requests keep decoding in "
        "every one of them (Scheduler tab).",
        effect="chunked",
        rule=("Each step spends at most max_num_batched_tokens tokens: running requests "
              "first (a decode costs one token), then waiting ones in arrival order with "
              "what is left; a prompt longer than that is chunked and continues next step "
              f"{UNIFIED_SCHEDULE.tag()}. The short requests arrive first, so their decodes "
              "are scheduled before each chunk." + cap),
        restart=restart, restart_why=why,
        estimate_s=estimate_s(long_tokens + 6 * 8, chunks + short_max + 8))


def forks(config: dict[str, Any], tokens: Tokens | None = None) -> Workload:
    shape, tokens = Shape.of(config), tokens or Tokens()
    bs = shape.block_size
    want = max(8, min(40, shape.max_model_len // 4))
    text = tokens.text(_FORK, want, shape.max_model_len // 3)
    if tokens.count and bs > 1:  # a partial last block: the samples share it, then copy it
        while len(text) > 8 and tokens.count(text) % bs == 0:
            text = text.rsplit(" ", 1)[0]
    max_tokens = _room(shape, tokens.most(text), 24)
    sub = Submission({"max_tokens": max_tokens, "n": 4, "temperature": 0.9, "top_p": 0.95,
                      "seed": 7}, prompt=text)
    if shape.n_sharing == "prefix_cache":
        return Workload(
            "n = 4 samples (prefix-cache sharing)", [[sub]],
            "The 4 samples are separate requests: they share the full prompt blocks as "
            "prefix-cache hits, and each computes its own partial last block.",
            effect="hits", rule=f"n_sharing = prefix_cache: {PREFIX_CACHE_SAMPLES.what} "
                                f"{PREFIX_CACHE_SAMPLES.tag()}",
            estimate_s=estimate_s(4 * tokens.most(text), max_tokens + 2))
    return Workload(
        "n = 4 forks (copy-on-write)", [[sub]],
        "4 samples share every block, even the partial last one; the first write into a "
        "shared block copies it (copy-on-write).",
        effect="copies", rule=f"n_sharing = cow: {COPY_ON_WRITE.what} {COPY_ON_WRITE.tag()}",
        estimate_s=estimate_s(tokens.most(text), max_tokens + 2))


def pressure_pool(shape: Shape) -> dict[str, Any]:
    """Restart options for a pool that fills in seconds: ``PRESSURE_SLOTS`` slots, with
    max_model_len lowered so one sequence still fits it (else the engine refuses)."""
    blocks = max(4, PRESSURE_SLOTS // shape.block_size)
    mml = min(shape.max_model_len, blocks * shape.block_size)
    return {"num_kv_blocks": blocks, "max_model_len": mml,
            "max_num_seqs": max(shape.max_num_seqs, 8)}


def memory_pressure(config: dict[str, Any], tokens: Tokens | None = None) -> Workload:
    shape, tokens = Shape.of(config), tokens or Tokens()
    n = max(4, min(shape.max_num_seqs, 8))
    cap = shape.capacity
    per = min(shape.max_model_len, max(16, math.ceil(cap * 3 / 2 / n)))  # ~1.5x the pool
    subs = []
    for i in range(n):
        text = tokens.text(f"Request {i}: " + _STORY, per // 4, max(8, per // 3))
        subs.append(Submission({"max_tokens": _room(shape, tokens.most(text),
                                                    per - tokens.most(text)),
                                "temperature": 0.0, "ignore_eos": True}, prompt=text))
    demand = sum(tokens.most(s.prompt) + s.params["max_tokens"] for s in subs)
    out_tokens = sum(s.params["max_tokens"] for s in subs)
    # running requests hold at most the pool: the steps are the output tokens over how
    # many fit at once, plus recomputation after each preemption
    fits = max(1.0, min(n, cap / max(1, demand / n)))
    est = estimate_s(demand - out_tokens + cap // 2, int(out_tokens / fits))
    restart = None
    why = ""
    if cap > PRESSURE_SLOTS * 2 or est > TIME_BUDGET_S:
        restart = pressure_pool(shape)
        why = (f"{cap} token slots take minutes to fill on a CPU; "
               f"{restart['num_kv_blocks']} blocks fill in seconds")
    return Workload(
        "Memory-pressure burst", [subs],
        "More tokens than the pool holds: preemption (recompute) and LRU eviction.",
        effect="pressure",
        rule=("When a running request needs a block and none is free, the newest running "
              f"request is preempted: its blocks are freed and it recomputes later "
              f"{PREEMPT_NEWEST.tag()}. Freed full blocks keep their hashes until a new "
              "allocation evicts the least recently used one."),
        restart=restart, restart_why=why, estimate_s=est)


PRESETS = {
    "shared_system_prompt": shared_system_prompt,
    "long_with_short": long_with_short,
    "forks": forks,
    "memory_pressure": memory_pressure,
}


def after_restart(config: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The config an engine reports after a restart with ``options`` (for sizing)."""
    out = dict(config)
    for k, v in options.items():
        out["num_blocks" if k == "num_kv_blocks" else k] = v
    return out

"""Benchmark workloads: seeded lists of (prompt token ids, output length).

Prompts are built as token-id lists through the model's chat template, so kvscope
and the transformers baseline see identical inputs. Every request runs greedy with
``ignore_eos``: it produces exactly its drawn output length on both systems, so both
do the same useful work and the output-length distribution is the one described.

- ``mixed``: chat-like traffic. Prompt and output lengths are log-normal (a long right
  tail, as in ShareGPT-style chat logs), scaled down so the baseline finishes in
  minutes on 2 CPU cores: user-message tokens ~ LogNormal(median 64, sigma 0.9)
  clipped to [16, 512]; output tokens ~ LogNormal(median 32, sigma 0.8) clipped to
  [4, 192]. Each prompt also carries the template's default system turn (~30 tokens).
- ``shared_prefix``: one system prompt of exactly 400 tokens (system turn included),
  then distinct questions; answers of 32-64 tokens (uniform).
- ``long_short``: one long prompt (1500 tokens) first in the queue, then short
  questions right behind it; 32 output tokens each.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

WORKLOADS = ("mixed", "shared_prefix", "long_short")

_SENTENCES = [
    "The paged key-value cache stores attention keys and values in fixed-size blocks.",
    "A block table maps each sequence's logical blocks to physical blocks in the pool.",
    "Lighthouses were once kept by families who trimmed the wicks every night.",
    "The recipe calls for two cups of flour, a pinch of salt and warm water.",
    "Autumn rain fell on the harbour while the fishing boats came home.",
    "Continuous batching lets new requests join as soon as others finish.",
    "The committee met on Tuesday to review the budget for the new library.",
    "Chess openings are studied for centuries, yet new ideas still appear.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "The museum's oldest map shows the river before the canal was dug.",
    "Prefix caching reuses the blocks of a prompt that another request computed.",
    "A robot chef learned to fold dumplings by watching thousands of videos.",
    "Mountain trails are safer in the morning before storms build up.",
    "The orchestra tuned to the oboe, then the hall fell silent.",
    "Copy-on-write lets two samples share a block until one of them writes.",
    "Volcanic soil is rich, which is why vineyards climb the slopes of Etna.",
    "She kept a notebook of every bird she saw on her walk to school.",
    "Compilers turn loops into vector instructions when the data allows it.",
    "The first snow of the year covered the bicycles in the courtyard.",
    "Historians argue about why the bronze age cities were abandoned.",
    "Chunked prefill splits a long prompt so short requests are not stuck behind it.",
    "The bakery opens at six, and the queue is already around the corner.",
    "Tides are driven mostly by the moon and a little by the sun.",
    "A lost key turned up months later inside the piano.",
    "Good tests describe behaviour, not the implementation that happens to exist.",
    "The spacecraft slowed down by skimming the upper atmosphere of Mars.",
    "Eviction removes the least recently used cached block when the pool is full.",
    "Markets in the old town sell spices, lanterns and hand-woven rugs.",
    "The river flooded twice that spring and the bridge had to be rebuilt.",
    "Teachers often ask students to predict an outcome before they look.",
]

_QUESTIONS = [
    "What is the capital of France?", "How do bees make honey?", "Why is the sky blue?",
    "Explain what a block table is.", "Give me three tips for learning chess.",
    "How does a refrigerator work?", "What causes the seasons?", "Summarise the water cycle.",
    "How do I bake bread at home?", "What is a prime number?", "Why do cats purr?",
    "How far away is the moon?", "What is photosynthesis?", "Name three famous painters.",
    "How do airplanes stay in the air?", "What is the tallest mountain?",
    "How does a vaccine work?", "Explain recursion to a child.", "What is inflation?",
    "Why do leaves change colour?", "How do volcanoes form?", "What is a black hole?",
    "How do I write a haiku?", "Why is exercise healthy?", "What is the speed of light?",
    "How do tides work?", "What is machine learning?", "Who wrote Hamlet?",
    "How do rainbows form?", "What is a noun?", "Why do we sleep?", "What is DNA?",
    "How does a compass work?", "What is gravity?", "How do fish breathe?",
    "What is an ecosystem?", "How are clouds formed?", "What is democracy?",
]


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int  # produced exactly (ignore_eos)
    tag: str = ""  # "long" / "short" in long_short


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    requests: tuple[BenchRequest, ...]
    shared_prefix_len: int = 0  # shared_prefix: tokens every prompt starts with

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt_ids) for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    def head(self, n: int, max_tokens: int | None = None) -> "Workload":
        """The first n requests (same order), outputs optionally capped at max_tokens."""
        reqs = tuple(BenchRequest(r.prompt_ids, min(r.max_tokens, max_tokens or r.max_tokens), r.tag)
                     for r in self.requests[:n])
        desc = f"the first {len(reqs)} requests of: {self.description}"
        if max_tokens:
            desc += f"; outputs capped at {max_tokens} tokens"
        return Workload(self.name, desc, reqs, self.shared_prefix_len)


@dataclass(frozen=True, slots=True)
class Scale:
    """Sizes of the three workloads; ``FULL`` is the issue's, others are smaller."""

    mixed_requests: int = 64
    mixed_prompt_median: float = 64
    mixed_prompt_range: tuple[int, int] = (16, 512)
    mixed_output_median: float = 32
    mixed_output_range: tuple[int, int] = (4, 192)
    shared_requests: int = 32
    shared_prefix_tokens: int = 400
    shared_output_range: tuple[int, int] = (32, 64)
    long_prompt_tokens: int = 1500
    short_requests: int = 16
    long_short_output: int = 32
    events_max_tokens: int = 64  # the events A/B caps its requests' outputs at this


FULL = Scale()
QUICK = Scale(mixed_requests=16, mixed_prompt_median=48, mixed_prompt_range=(16, 256),
              mixed_output_median=24, mixed_output_range=(4, 96), shared_requests=16,
              shared_output_range=(16, 32), long_prompt_tokens=600, short_requests=8,
              long_short_output=16, events_max_tokens=32)


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))))


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat, exactly as the engine tokenizes ``messages``."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def filler_text(tokenizer, rng: random.Random, num_tokens: int) -> str:
    """Plain English text of about ``num_tokens`` tokens (seeded sentence shuffle)."""
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < num_tokens:
        words.extend(rng.choice(_SENTENCES).split())
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids).strip()


def _fit(tokenizer, rng, target: int, build) -> list[int]:
    """Ids of ``build(text)`` with the filler text sized so the total is ``target`` tokens
    (or as close as the tokenizer allows from below)."""
    overhead = len(build(""))
    n = max(1, target - overhead)
    ids = build(filler_text(tokenizer, rng, n))
    for _ in range(8):  # re-tokenisation can shift the count by a token or two
        if len(ids) == target:
            break
        n += target - len(ids)
        ids = build(filler_text(tokenizer, random.Random(n), max(1, n)))
    return ids


def mixed(tokenizer, scale: Scale = FULL, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    reqs = []
    for i in range(scale.mixed_requests):
        p = _lognormal(rng, scale.mixed_prompt_median, 0.9, *scale.mixed_prompt_range)
        o = _lognormal(rng, scale.mixed_output_median, 0.8, *scale.mixed_output_range)
        q = rng.choice(_QUESTIONS)
        content = filler_text(tokenizer, rng, p) + "\n\n" + q
        reqs.append(BenchRequest(tuple(chat_ids(tokenizer, [{"role": "user", "content": content}])), o))
    desc = (f"{scale.mixed_requests} chat requests; user-message tokens ~ LogNormal(median "
            f"{scale.mixed_prompt_median:g}, sigma 0.9) clipped to {list(scale.mixed_prompt_range)}, "
            f"output tokens ~ LogNormal(median {scale.mixed_output_median:g}, sigma 0.8) clipped to "
            f"{list(scale.mixed_output_range)}; seed {seed}")
    return Workload("mixed", desc, tuple(reqs))


def shared_prefix(tokenizer, scale: Scale = FULL, seed: int = 0) -> Workload:
    rng = random.Random(seed + 1)
    n = scale.shared_prefix_tokens

    prefix = _fit(tokenizer, rng, n, lambda text: _system_only(tokenizer, "You are a patient teacher. " + text))
    reqs = []
    questions = list(_QUESTIONS)
    rng.shuffle(questions)
    for i in range(scale.shared_requests):
        q = questions[i % len(questions)] + ("" if i < len(questions) else f" (variant {i})")
        # the user turn's ids, tokenized exactly as inside a full chat (specials split first)
        head = _system_only(tokenizer, "x")
        full = chat_ids(tokenizer, [{"role": "system", "content": "x"}, {"role": "user", "content": q}])
        assert full[: len(head)] == head, "chat template does not split at the system turn"
        user_turn = full[len(head):]
        reqs.append(BenchRequest(tuple(prefix + user_turn), rng.randint(*scale.shared_output_range)))
    desc = (f"{scale.shared_requests} requests sharing a {len(prefix)}-token system prompt, each with a "
            f"distinct question; output tokens uniform in {list(scale.shared_output_range)}; seed {seed}")
    return Workload("shared_prefix", desc, tuple(reqs), shared_prefix_len=len(prefix))


def _system_only(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "system", "content": text}], tokenize=False,
                                      add_generation_prompt=False), add_special_tokens=False)


def long_short(tokenizer, scale: Scale = FULL, seed: int = 0) -> Workload:
    rng = random.Random(seed + 2)
    long_ids = _fit(tokenizer, rng, scale.long_prompt_tokens,
                    lambda text: chat_ids(tokenizer, [{"role": "user", "content": "Summarise this text:\n" + text}]))
    reqs = [BenchRequest(tuple(long_ids), scale.long_short_output, "long")]
    for i in range(scale.short_requests):
        q = _QUESTIONS[(i * 7 + seed) % len(_QUESTIONS)]
        reqs.append(BenchRequest(tuple(chat_ids(tokenizer, [{"role": "user", "content": q}])),
                                 scale.long_short_output, "short"))
    shorts = [len(r.prompt_ids) for r in reqs[1:]]
    desc = (f"one {len(long_ids)}-token prompt first in the queue, then {scale.short_requests} short "
            f"prompts ({min(shorts)}-{max(shorts)} tokens) right behind it; "
            f"{scale.long_short_output} output tokens each")
    return Workload("long_short", desc, tuple(reqs))


def build(name: str, tokenizer, scale: Scale = FULL, seed: int = 0) -> Workload:
    """One workload by name (see WORKLOADS)."""
    builders = {"mixed": mixed, "shared_prefix": shared_prefix, "long_short": long_short}
    if name not in builders:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return builders[name](tokenizer, scale, seed)

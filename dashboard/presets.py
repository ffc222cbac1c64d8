"""Teaching presets: one click creates a workload that shows one PagedAttention idea.

Sizes adapt to the running engine (``max_model_len``, pool capacity), because the
dashboard has no tokenizer: text lengths are chosen in characters, and byte-level
tokenizers (the worst case) make at most about one token per character, so a
prompt of ``c`` characters never exceeds ``c + 16`` tokens with a chat template.
A preset is a list of waves; a wave is submitted once every request of the
previous wave has produced its first token (so its prompt blocks are cached).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TEMPLATE_SLACK = 24  # tokens a chat template and BOS may add around the text

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


@dataclass(frozen=True, slots=True)
class Submission:
    """One ``submit`` op: ``prompt`` (text) or ``messages`` (chat), and sampling params."""

    params: dict[str, Any]
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    waves: list[list[Submission]] = field(default_factory=list)
    watch: str = ""  # what to look at on the Live page

    @property
    def size(self) -> int:
        return sum(len(w) for w in self.waves)


def _fit(text: str, chars: int) -> str:
    """``text`` repeated or cut to about ``chars`` characters (at a word boundary)."""
    chars = max(8, chars)
    out = (text * (chars // len(text) + 1))[:chars]
    return out.rsplit(" ", 1)[0] if " " in out else out


def _room(mml: int, text_chars: int, want: int) -> int:
    """max_tokens that keeps prompt (worst case) + output within max_model_len (>= 1)."""
    return max(1, min(want, mml - text_chars - TEMPLATE_SLACK))


def _limits(config: dict[str, Any]) -> tuple[int, int]:
    """(max_model_len, pool capacity in token slots) with safe fallbacks."""
    mml = int(config.get("max_model_len") or 2048)
    cap = int(config.get("num_blocks") or 256) * int(config.get("block_size") or 16)
    return mml, cap


def shared_system_prompt(config: dict[str, Any]) -> Workload:
    mml, cap = _limits(config)
    per = min(mml, cap // 10)  # 8 requests + headroom fit in the pool without pressure
    budget = mml - TEMPLATE_SLACK - 2  # prompt characters that leave room for an answer
    q_chars = max(4, min(max(len(q) for q in _QUESTIONS), budget // 2))
    system = _fit(_SYSTEM, max(4, min(int(per * 0.55), budget - q_chars)))
    max_tokens = _room(mml, len(system) + q_chars, 48)
    subs = [Submission({"max_tokens": max_tokens, "temperature": 0.0},
                       messages=[{"role": "system", "content": system},
                                 {"role": "user", "content": q[:q_chars]}]) for q in _QUESTIONS]
    return Workload("Shared system prompt × 8", [subs[:1], subs[1:]],
                    "The first request fills the cache; the other seven hit it and share its "
                    "blocks (violet). Watch the prefix hit rate jump.")


def long_with_short(config: dict[str, Any]) -> Workload:
    mml, cap = _limits(config)
    long_chars = max(8, min(int(mml * 0.7), cap // 3) - TEMPLATE_SLACK)
    story = _fit(_STORY, long_chars)
    subs = [Submission({"max_tokens": _room(mml, len(story), 32), "temperature": 0.0},
                       prompt=story)]
    subs += [Submission({"max_tokens": _room(mml, len(s), 24), "temperature": 0.0}, prompt=s)
             for s in _SHORT]
    return Workload("One long prompt with short ones", [subs],
                    "Chunked prefill: the long prompt's chunks share each step's token budget "
                    "with the short ones' decodes (Scheduler tab).")


def forks(config: dict[str, Any]) -> Workload:
    mml, _ = _limits(config)
    text = _fit("Once upon a time, in a city built of memory blocks, ",
                max(8, min(160, mml // 3)))
    sub = Submission({"max_tokens": _room(mml, len(text), 40), "n": 4, "temperature": 0.9,
                      "top_p": 0.95, "seed": 7}, prompt=text)
    return Workload("n = 4 forks (copy-on-write)", [[sub]],
                    "4 samples share every block, even the partial last one; the first write "
                    "into a shared block copies it (copy-on-write).")


def memory_pressure(config: dict[str, Any]) -> Workload:
    mml, cap = _limits(config)
    seqs = int(config.get("max_num_seqs") or 16)
    n = max(4, min(seqs, 16))
    per = min(mml, max(16, (cap * 3 // 2) // n))  # ~1.5× the pool in total
    subs = []
    for i in range(n):
        text = _fit(f"Request {i}: " + _STORY, max(8, per // 4))
        subs.append(Submission({"max_tokens": _room(mml, len(text), per - len(text)),
                                "temperature": 0.0, "ignore_eos": True}, prompt=text))
    return Workload("Memory-pressure burst", [subs],
                    "More tokens than the pool holds: preemption (recompute) and LRU eviction. "
                    "Best with a small pool (Engine page).")


PRESETS = {
    "shared_system_prompt": shared_system_prompt,
    "long_with_short": long_with_short,
    "forks": forks,
    "memory_pressure": memory_pressure,
}

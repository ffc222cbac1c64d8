"""A small two-pod workload for the dashboard tests: words as tokens, so blocks have text.

``word_tokenizer`` writes a ``tokenizer.json`` (``tokenizers`` only: a word-level
vocabulary) whose ids are the words' positions; ``publish_demo`` sends two pods a
shared system prompt, questions after it (a shared prefix), an eviction and a hole.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.attach.fake_publisher import FakePublisher, removed, stored

WORDS = ("[UNK] you are a helpful assistant who answers in one short line . what is a block "
         "page cache hash slot table why do we share prefixes across requests").split()
BS = 4
SYSTEM = "you are a helpful assistant who answers in one short line ."  # 12 words: 3 blocks


def word_tokenizer(directory: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = directory / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def ids(text: str) -> list[int]:
    index = {}
    for w in WORDS:
        index.setdefault(w, len(index))
    return [index.get(w, 0) for w in text.split()]


def publish_demo(a: FakePublisher, b: FakePublisher,
                 between: Callable[[], None] | None = None) -> None:
    """pod-a: the system prompt + four questions (a shared prefix) and an eviction;
    pod-b: the system prompt + one question, then a batch lost for good (a hole).

    ``between`` runs after pod-a's batches are sent and before pod-b's: a test that
    needs pod-a's batches recorded first (the removal before the hole) waits there, as
    the two pods' streams reach the attach worker over separate sockets, in either
    order."""
    sys_ids = ids(SYSTEM)
    q1, q2 = ids("what is a block"), ids("why do we share")
    a.publish([stored([1, 2, 3], None, sys_ids, BS)])
    a.publish([stored([4], 3, q1, BS)])
    a.publish([stored([5], 3, q2, BS)])
    a.publish([stored([6], 5, ids("prefixes across requests ."), BS)])
    a.publish([removed([4])])
    a.publish([stored([7], 3, ids("what is a page"), BS)])
    a.publish([stored([8], 3, ids("what is a slot"), BS)])
    if between is not None:
        between()
    b.publish([stored([11, 12, 13], None, sys_ids, BS)])
    b.publish([stored([14], 13, ids("what is a cache"), BS)])
    b.publish([removed([14])], drop_live=True, drop_replay=True)
    b.publish([stored([15], 13, ids("what is a hash"), BS)])

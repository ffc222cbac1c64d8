"""engine.tokenizer.Tokenizer (tokenizer.json, no torch) against transformers' AutoTokenizer.

The serving process tokenizes with it, the engine core takes its eos id from it
(``engine.model.loader``), lessons and benchmarks build prompts with it: its ids, texts,
chat renderings and eos id must be the fast tokenizer's, on every test model and the
default one.
"""

from __future__ import annotations

import pytest

from engine.tokenizer import Tokenizer
from tests.tiny_models import KINDS, tiny_model_dir

TEXTS = ["the cat sat on the mat", "Paged attention, the 2nd time: ünïcode ok!", "  spaces\n\nand lines ",
         "", "emoji 🙂 and 中文"]
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]


def _agree(weights_dir) -> None:
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer(weights_dir), AutoTokenizer.from_pretrained(str(weights_dir))
    assert ours.eos_token_id == theirs.eos_token_id
    assert len(ours) == len(theirs)
    for text in TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == theirs.encode(text, add_special_tokens=special), (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    if theirs.chat_template:
        for generation in (True, False):
            assert ours.apply_chat_template(CHAT, add_generation_prompt=generation) == \
                theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=generation)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_models(kind):
    _agree(tiny_model_dir(kind))


@pytest.mark.slow
def test_default_model():
    from engine.model.loader import resolve_model_dir

    _agree(resolve_model_dir("smollm2-135m")[0])

"""Tokenizer: a model directory's fast tokenizer without transformers' model side (no torch).

The serving process tokenizes and detokenizes (as vLLM's API server does) and never
imports torch, but ``transformers.AutoTokenizer`` imports it. This reads what an HF
directory saves (``tokenizer.json`` for the Rust ``tokenizers`` backend,
``tokenizer_config.json`` for the special tokens, the chat template from
``chat_template.jinja`` or the config) and renders chats with transformers' own jinja
renderer (``transformers.utils.chat_template_utils``, which imports no torch), so its
ids and chat texts are the fast tokenizer's (tests/engine/test_tokenizer.py checks
them against ``AutoTokenizer`` on every test model and the default one).

Only the calls kvscope makes are here: ``encode``, ``decode``, ``apply_chat_template``
(text only), ``len``, ``eos_token_id``, ``chat_template`` and ``backend_tokenizer``
(the incremental detokenizer's ``DecodeStream`` steps it). Writer: none after loading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.core.errors import KVScopeError

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                "mask_token")


class Tokenizer:
    def __init__(self, weights_dir: str | Path) -> None:
        from tokenizers import Tokenizer as Backend

        d = Path(weights_dir)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{d} has no tokenizer.json; kvscope needs a fast tokenizer")
        self.backend_tokenizer = Backend.from_file(str(path))
        config = _read_json(d / "tokenizer_config.json")
        self.special_tokens_map = {k: _content(config[k]) for k in SPECIAL_KEYS if config.get(k)}
        template = d / "chat_template.jinja"
        self.chat_template: str | None = (template.read_text() if template.is_file()
                                          else config.get("chat_template"))
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id: int | None = self.backend_tokenizer.token_to_id(eos) if eos else None

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        """The chat rendered to text, as the fast tokenizer's ``apply_chat_template`` does."""
        if tokenize:
            raise ValueError("apply_chat_template renders text only; encode the text")
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template(conversations=[messages], chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt,
                                            **self.special_tokens_map)
        return rendered[0]


def developer_as_system(messages: list[dict], template: str) -> list[dict]:
    """OpenAI's ``developer`` role for a template that does not name it: vLLM's rule
    (``vllm/renderers/hf.py``): developer messages become system ones, and several
    system messages, or one not first, merge into one at the front ("\n\n" between)."""
    if not any(m.get("role") == "developer" for m in messages) or \
            '"developer"' in template or "'developer'" in template:
        return messages
    msgs = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
    system = [i for i, m in enumerate(msgs) if m["role"] == "system"]
    if system == [0] or not system:
        return msgs
    merged = "\n\n".join(msgs[i]["content"] for i in system if msgs[i]["content"])
    return [{"role": "system", "content": merged}] + [m for m in msgs if m["role"] != "system"]


def tokenize_prompt(tokenizer: Any, vocab_size: int, prompt: str | list[int] | None = None,
                    messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
    """(text, token ids) of a chat (rendered with the template, then encoded without
    special tokens: the template wrote them), a text, or a list of token ids (checked
    against the vocabulary; text None). The one tokenizing rule: the engine's and every
    front door's (``engine.server.worker.prompt_prep``)."""
    if messages is not None:
        messages = developer_as_system(messages, getattr(tokenizer, "chat_template", None) or "")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, tokenizer.encode(text, add_special_tokens=False)
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise KVScopeError(f"token ids out of the vocabulary (0..{vocab_size - 1}): {bad[:5]}")
        return None, list(prompt)
    raise KVScopeError("a prompt must be a string or a list of token ids")


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _content(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else str(token)

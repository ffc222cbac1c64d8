"""PromptPrep: a submit's prompt checked and tokenized before the engine thread sees it.

Tokenizing is the one per-request cost that grows with what a client sends (a 1 MB
prompt takes ~2 s on the tiny tokenizer, ~0.7 s on SmolLM2's), and on the engine
thread it stalls every other client's steps. As in vLLM, where the API server
process tokenizes and the engine core gets token ids, the websocket front door runs
``prepare`` in a worker thread (``Hub``) and posts a ``Prepared`` command; the
engine thread only enters it. (HF fast tokenizers release the GIL while encoding,
so the worker does not stall the engine thread either.)

``prepare`` refuses, in this order and without tokenizing anything it refuses:
- a prompt longer in bytes than any prompt that can fit (``prompt_too_large``):
  every token covers at most ``max_token_bytes`` bytes of text (the longest token
  the vocabulary decodes to), so a text of more than ``max_model_len *
  max_token_bytes`` bytes has at least ``max_model_len`` tokens. Sound for
  tokenizers that do not normalize text (byte-level BPE: Llama 3, Qwen2, SmolLM2);
  a normalizer may shrink text, so with one the bound is taken 4x looser, and a
  normalizer that deletes characters can still make it pass a prompt that then
  fails the token count (never the reverse);
- chat roles other than system, user and assistant, plus tool where the model's
  chat template mentions it (``bad_request``);
- token ids outside the vocabulary (``bad_request``);
- more tokens than ``max_model_len`` leaves room for (``prompt_too_long``).

One PromptPrep per engine (its limits change with a restart). Its tokenizer is a
copy of the engine's, so the worker never shares a tokenizer object with the
engine thread's detokenizer. Writer: none after construction (read-only).
"""

from __future__ import annotations

import copy
from typing import Any

from engine.core.config import check_prompt_length
from engine.core.errors import KVScopeError
from engine.protocol.errors import ErrorCode, ProtocolError, code_of
from engine.protocol.ops import Submit
from engine.server.worker.mailbox import Prepared
from engine.tokenizer import tokenize_prompt

CHAT_ROLES = ("system", "developer", "user", "assistant")  # developer: OpenAI's, rendered as is (vLLM)
NORMALIZER_SLACK = 4  # a normalizer may shrink text; how much looser the byte bound is then


class PromptPrep:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int,
                 max_token_bytes: int | None = None, source: Any = None) -> None:
        self.tokenizer = tokenizer
        self.source = source  # the engine's tokenizer this one copies (reused by a restart)
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_token_bytes = max_token_bytes or longest_token_bytes(tokenizer)
        template = getattr(tokenizer, "chat_template", None) or ""
        self.roles = CHAT_ROLES + (("tool",) if "tool" in template else ())

    @classmethod
    def of(cls, engine: Any, previous: PromptPrep | None = None) -> PromptPrep:
        """The prep for ``engine`` (on the engine thread); a restart reuses the previous
        one's tokenizer copy and byte figure when the tokenizer is the same."""
        max_len, source = engine.max_model_len, engine.tokenizer
        if previous is not None and previous.source is source:
            return cls(previous.tokenizer, previous.vocab_size, max_len, previous.max_token_bytes, source)
        return cls(copy.deepcopy(source), engine.info.vocab_size, max_len, source=source)

    @property
    def max_prompt_bytes(self) -> int:
        slack = NORMALIZER_SLACK if self.tokenizer.backend_tokenizer.normalizer is not None else 1
        return self.max_model_len * self.max_token_bytes * slack

    def prepare(self, op: Submit) -> Prepared:
        """Check and tokenize ``op``'s prompt; raises ProtocolError with the request id."""
        prepared = self.tokenized(op)
        try:
            check_prompt_length(len(prepared.token_ids), self.max_model_len)
        except KVScopeError as exc:
            raise ProtocolError(code_of(exc), str(exc), op.request_id, op.type) from None
        return prepared

    def tokenized(self, op: Submit) -> Prepared:
        """Every check of ``prepare`` but the token count (the OpenAI API words that one
        as vLLM does: ``engine.openai.context_length``)."""
        rid = op.request_id

        def refuse(code: str, message: str) -> ProtocolError:
            return ProtocolError(code, message, rid, op.type)

        limit = self.max_prompt_bytes
        if op.messages is not None:
            for m in op.messages:
                if m["role"] not in self.roles:
                    raise refuse(ErrorCode.BAD_REQUEST, f"chat role {m['role']!r} is not one of "
                                 f"{list(self.roles)}")
            size = sum(len(m["content"].encode("utf-8", "surrogatepass")) for m in op.messages)
        elif isinstance(op.prompt, str):
            size = len(op.prompt.encode("utf-8", "surrogatepass"))
        else:
            size = 0
        if size > limit:
            raise refuse(ErrorCode.PROMPT_TOO_LARGE, f"the prompt has {size} bytes; no prompt of more "
                         f"than {limit} bytes fits in max_model_len={self.max_model_len} (a token "
                         f"covers at most {self.max_token_bytes} bytes)")
        try:
            text, ids = tokenize_prompt(self.tokenizer, self.vocab_size, op.prompt, op.messages)
        except KVScopeError as exc:  # token ids out of the vocabulary
            raise refuse(ErrorCode.BAD_REQUEST, str(exc)) from None
        except Exception as exc:  # a template or tokenizer that rejects this input
            raise refuse(ErrorCode.BAD_REQUEST, f"{type(exc).__name__}: {exc}") from None
        return Prepared(op, text, ids)


def longest_token_bytes(tokenizer: Any) -> int:
    """The most UTF-8 bytes any one token decodes to (SmolLM2: 81, a run of spaces): one
    Rust call for the whole vocabulary (~0.1 s for 49k)."""
    texts = tokenizer.backend_tokenizer.decode_batch([[i] for i in range(len(tokenizer))],
                                                     skip_special_tokens=False)
    return max(1, max(len(t.encode("utf-8", "surrogatepass")) for t in texts))

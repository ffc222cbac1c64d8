"""Assembler: one API call's choices, folded from the engine's RequestOutputs.

An API call runs as one engine request per prompt (ids ``rids``); each has ``n``
samples. Choice ``index`` = prompt index * n + sample index, as in vLLM. Streaming
text comes from the engine's ``deltas`` only (the engine holds back partial UTF-8
characters and stop-string prefixes), never re-derived from token ids; logprobs are
sliced from the sample's cumulative list by the tokens already sent. A non-streamed
answer is built from the final outputs.

Writer: the exchange's handler task (one Assembler per API call, loop thread).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.openai import response as R
from engine.openai.request import ApiRequest, Endpoint
from engine.openai.token_strings import TokenStrings
from engine.outputs import CompletionOutput, RequestOutput


@dataclass(frozen=True, slots=True)
class Update:
    """What arrived for one engine request since the last look: the latest output and
    the deltas of every output in between, merged per sample."""

    output: RequestOutput
    deltas: dict[int, tuple[str, list[int]]]


@dataclass(slots=True)
class _Choice:
    index: int
    echo: str = ""  # text put in front of the answer (echo)
    tokens_sent: int = 0
    # completions' text_offset of the next token: the echo plus the token strings so far
    # (as a non-streamed answer counts them, so both give the same offsets)
    offset: int = 0
    finished: bool = False


@dataclass(slots=True)
class Assembler:
    req: ApiRequest
    rids: list[str]
    response_id: str
    model: str
    created: int
    strings: TokenStrings
    latest: dict[str, RequestOutput] = field(default_factory=dict)
    _choices: dict[tuple[str, int], _Choice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.req.params.n
        for p, rid in enumerate(self.rids):
            echo = self._echo(p)
            for k in range(n):
                self._choices[(rid, k)] = _Choice(p * n + k, echo, offset=len(echo))

    @property
    def chat(self) -> bool:
        return self.req.endpoint is Endpoint.CHAT

    @property
    def object(self) -> str:
        return R.CHAT_CHUNK if self.chat else R.COMPLETION

    def _echo(self, p: int) -> str:
        if not self.req.echo:
            return ""
        if self.chat:  # vLLM: the last message, when it is the assistant's (a prefill)
            last = self.req.messages[-1]
            return last["content"] if last["role"] == "assistant" else ""
        prompt = self.req.prompts[p]
        return prompt if isinstance(prompt, str) else self.strings.decode(prompt)

    # ---- state ----------------------------------------------------------------

    def note(self, update: Update) -> None:
        self.latest[update.output.request_id] = update.output

    @property
    def done(self) -> bool:
        return len(self.latest) == len(self.rids) and all(o.finished for o in self.latest.values())

    def usage(self) -> dict[str, Any]:
        outs = list(self.latest.values())
        return R.usage(sum(len(o.prompt_token_ids) for o in outs),
                       sum(len(c.token_ids) for o in outs for c in o.outputs),
                       sum(o.num_cached_tokens for o in outs))

    def _stop_reason(self, c: CompletionOutput) -> str | int | None:
        # The engine names the EOS token that stopped a sample; vLLM reports null there
        # and keeps stop_reason for the caller's own stop strings and stop_token_ids.
        if isinstance(c.stop_reason, int) and c.stop_reason not in self.req.params.stop_token_ids:
            return None
        return c.stop_reason

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        if self.req.tokens_as_ids:
            name = f"token_id:{token_id}"
            return name, list(name.encode())
        return self.strings.token(token_id)

    def _logprobs(self, c: CompletionOutput, ids: list[int], start: int, offset: int):
        if self.req.logprobs is None:
            return None
        entries = (c.logprobs or [])[start:start + len(ids)]
        if self.chat:
            return R.chat_logprobs(ids, entries, self._token, self.req.logprobs)
        return R.completion_logprobs(ids, entries, self._token, offset, self.req.logprobs)

    # ---- streaming ----------------------------------------------------------------

    def _ids(self, choice: dict[str, Any], ids: list[int]) -> dict[str, Any]:
        if self.req.return_token_ids:  # vLLM's extra: the tokens behind the text
            choice["token_ids"] = list(ids)
        return choice

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return R.envelope(self.response_id, self.object, self.created, self.model, [choice])

    def opening(self) -> list[dict[str, Any]]:
        """Chunks before any token: chat's role delta per choice (then its echo); a
        completion's echo."""
        out = []
        for ch in sorted(self._choices.values(), key=lambda c: c.index):
            if self.chat:
                out.append(self._chunk(R.chat_delta(ch.index, {"role": "assistant", "content": ""})))
                if ch.echo:
                    out.append(self._chunk(R.chat_delta(ch.index, {"content": ch.echo})))
            elif ch.echo:
                out.append(self._chunk(R.completion_choice(ch.index, ch.echo, None, None, None)))
        return out

    def chunks(self, update: Update) -> list[dict[str, Any]]:
        """The chunks one update adds, by choice index: content, then finishes."""
        self.note(update)
        out = update.output
        rid = out.request_id
        found = []
        for c in sorted(out.outputs, key=lambda c: c.index):
            ch = self._choices[(rid, c.index)]
            if ch.finished:
                continue
            text, ids = update.deltas.get(c.index, ("", []))
            ends = c.finish_reason is not None
            if not (text or ids or ends):
                continue
            logprobs = self._logprobs(c, list(ids), ch.tokens_sent, ch.offset)
            ch.tokens_sent += len(ids)
            if logprobs is not None:
                ch.offset += sum(len(self._token(t)[0]) for t in ids)
            reason, stop = (c.finish_reason, self._stop_reason(c)) if ends else (None, None)
            # A token may decode to nothing yet (half a character): its text comes with a
            # later delta; a chunk goes out now only with text, or tokens the caller wants
            # to see (logprobs, token ids).
            says = bool(text) or bool(ids) and (logprobs is not None or self.req.return_token_ids)
            if self.chat:
                if says:
                    found.append((ch.index, self._ids(
                        R.chat_delta(ch.index, {"content": text}, logprobs), ids)))
                if ends:  # the finish rides an empty delta of its own
                    found.append((ch.index, R.chat_delta(ch.index, {}, None, reason, stop)))
            elif says or ends:
                found.append((ch.index, self._ids(
                    R.completion_choice(ch.index, text, logprobs, reason, stop), ids)))
            ch.finished = ends
        return [self._chunk(choice) for _, choice in sorted(found, key=lambda x: x[0])]

    def usage_chunk(self) -> dict[str, Any]:
        return R.envelope(self.response_id, self.object, self.created, self.model, [], self.usage())

    # ---- the whole answer -------------------------------------------------------------

    def body(self) -> dict[str, Any]:
        """The non-streamed response, from the final outputs."""
        choices = []
        for rid in self.rids:
            for c in sorted(self.latest[rid].outputs, key=lambda c: c.index):
                ch = self._choices[(rid, c.index)]
                logprobs = self._logprobs(c, list(c.token_ids), 0, len(ch.echo))
                make = R.chat_choice if self.chat else R.completion_choice
                choices.append(self._ids(make(ch.index, ch.echo + c.text, logprobs, c.finish_reason,
                                              self._stop_reason(c)), c.token_ids))
        choices.sort(key=lambda c: c["index"])
        return R.envelope(self.response_id, R.CHAT if self.chat else R.COMPLETION, self.created,
                          self.model, choices, self.usage())

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
    # completions' text_offset of the next token: the token strings so far (an echo's
    # prompt tokens included), as a non-streamed answer counts them
    offset: int = 0
    started: bool = False  # a chunk of it went out (the echo and prompt ids ride the first)
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
                self._choices[(rid, k)] = _Choice(p * n + k, echo)

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

    def _usage(self, final: bool) -> dict[str, Any]:
        outs = list(self.latest.values())
        return R.usage(sum(len(o.prompt_token_ids) for o in outs),
                       sum(len(c.token_ids) for o in outs for c in o.outputs),
                       sum(o.num_cached_tokens for o in outs), self.chat, final)

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

    def _prompt_logprobs(self, out: RequestOutput) -> list | None:
        return R.prompt_logprobs(out.prompt_logprobs, self._token)

    def _piece(self, out: RequestOutput, c: CompletionOutput, ch: _Choice, text: str,
               ids: list[int], start: int, first: bool) -> tuple[str, list[int], Any]:
        """(text, token ids, logprobs) of a choice's next piece: its tokens from ``start``,
        behind the echoed prompt on a completion's first piece (its prompt tokens carry the
        prompt logprobs, the first none); with max_tokens 0 only the prompt."""
        entries = list((c.logprobs or [])[start:start + len(ids)])
        if not self.chat and self.req.echo and first:
            prompt_ids = list(out.prompt_token_ids)
            prompt_entries = R.prompt_logprob_entries(out.prompt_logprobs)
            if self.req.echo_only:
                text, ids, entries = ch.echo, prompt_ids, prompt_entries
            else:
                text, ids, entries = ch.echo + text, prompt_ids + ids, prompt_entries + entries
        elif self.chat and first:
            text = ch.echo + text  # (a stream sent the chat echo in its opening)
        if self.req.logprobs is None:
            return text, ids, None
        if self.chat:
            return text, ids, R.chat_logprobs(ids, entries, self._token, self.req.logprobs)
        lp = R.completion_logprobs(ids, entries, self._token, ch.offset, self.req.logprobs)
        ch.offset += sum(len(t) for t in lp["tokens"])
        return text, ids, lp

    # ---- streaming ----------------------------------------------------------------

    def _chunk(self, choice: dict[str, Any], use: dict[str, Any] | None = None, **extra) -> dict[str, Any]:
        return R.chunk(self.response_id, self.object, self.created, self.model, [choice], use, **extra)

    def _running(self, rid: str, ch: _Choice) -> dict[str, Any] | None:
        if not self.req.continuous_usage:
            return None
        out = self.latest.get(rid)
        prompt = len(out.prompt_token_ids) if out is not None else 0
        return R.running_usage(prompt, ch.tokens_sent, self.chat)

    def opening(self, prompt_token_ids: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
        """Chunks before any token: chat's role delta per choice (with the prompt's token
        ids at the top when asked: ``prompt_token_ids`` by request id), then its echo."""
        out = []
        if not self.chat:
            return out
        for (rid, _), ch in sorted(self._choices.items(), key=lambda kv: kv[1].index):
            ids = (prompt_token_ids or {}).get(rid) if self.req.return_token_ids else None
            extra = {"prompt_token_ids": ids, "prompt_text": None}  # vLLM sets both, null or not
            out.append(self._chunk(R.chat_delta(ch.index, {"role": "assistant", "content": ""},
                                                role=True), self._running_prompt(prompt_token_ids, rid), **extra))
            if ch.echo:
                out.append(self._chunk(R.chat_delta(ch.index, {"content": ch.echo})))
            ch.started = True
        return out

    def _running_prompt(self, prompt_token_ids, rid) -> dict[str, Any] | None:
        if not self.req.continuous_usage:
            return None
        return R.running_usage(len((prompt_token_ids or {}).get(rid) or ()), 0, self.chat)

    def chunks(self, update: Update) -> list[dict[str, Any]]:
        """The chunks one update adds, by choice index; a choice's finish rides its last
        piece, as vLLM's."""
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
            first = not ch.started
            if not (text or ids or ends):
                continue  # (an echo waits for the first token: the prompt logprobs are whole then)
            start = ch.tokens_sent
            ch.tokens_sent += len(ids)
            if self.chat and first:
                first = False  # the opening sent the role and echo
            text, shown, logprobs = self._piece(out, c, ch, text, list(ids), start, first)
            reason, stop = (c.finish_reason, self._stop_reason(c)) if ends else (None, None)
            # A token may decode to nothing yet (half a character): its text comes with a
            # later delta; a chunk goes out now only with text, or tokens the caller wants
            # to see (logprobs, token ids), or the finish.
            says = bool(text) or bool(ids) and (logprobs is not None or self.req.return_token_ids)
            if not (says or ends):
                continue
            token_ids = list(ids) if self.req.return_token_ids else None
            use = self._running(rid, ch)
            if self.chat:
                choice = R.chat_delta(ch.index, {"content": text}, logprobs, reason, stop, token_ids)
            else:
                prompt_ids = list(out.prompt_token_ids) if first and self.req.return_token_ids else None
                choice = R.completion_chunk_choice(ch.index, text, logprobs, reason, stop,
                                                   prompt_ids, token_ids)
            # vLLM stamps the fingerprint on a choice's last chunk unless a usage chunk follows
            extra = {"system_fingerprint": R.SYSTEM_FINGERPRINT} if ends and not self.req.include_usage else {}
            found.append((ch.index, self._chunk(choice, use, **extra)))
            ch.started, ch.finished = True, ends
        return [c for _, c in sorted(found, key=lambda x: x[0])]

    def usage_chunk(self) -> dict[str, Any]:
        return R.chunk(self.response_id, self.object, self.created, self.model, [],
                       self._usage(final=True), system_fingerprint=R.SYSTEM_FINGERPRINT)

    # ---- the whole answer -------------------------------------------------------------

    def body(self) -> dict[str, Any]:
        """The non-streamed response, from the final outputs."""
        choices = []
        for rid in self.rids:
            out = self.latest[rid]
            for c in sorted(out.outputs, key=lambda c: c.index):
                ch = self._choices[(rid, c.index)]
                text, _, logprobs = self._piece(out, c, ch, c.text, list(c.token_ids), 0, True)
                ids = list(c.token_ids) if self.req.return_token_ids else None
                if self.chat:
                    choice = R.chat_choice(ch.index, text, logprobs, c.finish_reason,
                                           self._stop_reason(c), ids)
                else:
                    choice = R.completion_choice(
                        ch.index, text, logprobs, c.finish_reason, self._stop_reason(c), ids,
                        self._prompt_logprobs(out),
                        list(out.prompt_token_ids) if self.req.return_token_ids else None)
                choices.append(choice)
        choices.sort(key=lambda c: c["index"])
        top = None
        if self.chat:
            out = self.latest[self.rids[0]]
            top = {"prompt_logprobs": self._prompt_logprobs(out),
                   "prompt_token_ids": list(out.prompt_token_ids) if self.req.return_token_ids else None}
        return R.envelope(self.response_id, R.CHAT if self.chat else R.COMPLETION, self.created,
                          self.model, choices, self._usage(final=False), top)

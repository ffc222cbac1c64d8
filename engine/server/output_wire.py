"""The output wire: a running request's ``RequestOutput`` across the engine process's pipe.

A running request's output holds its whole prompt and every token and logprob so far
(live views in the engine's thread). Sent whole every step, a long request would cost
O(length) per step. ``OutputWire`` (the engine process's side) sends an ``OutputDelta``
instead: the prompt once, then only new tokens and logprobs; ``OutputMirror`` (the
server's side) rebuilds the same ``RequestOutput``, with lists that only grow, as the
live views do. A finished output is sent whole and ends both sides' record of it.
Used by ``engine.server.engine_process``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(slots=True)
class OutputDelta:
    """A running request's ``RequestOutput`` as it crosses the pipe: what is new only.

    ``head``: (prompt, prompt token ids), on the request's first output only.
    ``samples``: per sample (index, text, new token ids, new logprobs or None,
    finish_reason, stop_reason, cumulative_logprob)."""

    request_id: str
    head: tuple[str | None, list[int]] | None
    samples: list[tuple[int, str, list[int], list | None, str | None, Any, float | None]]
    num_cached_tokens: int
    metrics: RequestMetrics | None
    deltas: dict[int, tuple[str, list[int]]]


class OutputWire:
    """The child's side: what of each request's samples the parent already has."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[int, tuple[int, int]]] = {}  # rid -> index -> (tokens, logprobs)

    def slim(self, out: RequestOutput) -> RequestOutput | OutputDelta:
        if out.finished:
            self.sent.pop(out.request_id, None)
            return out  # its lists are plain lists now, sent once
        known = self.sent.get(out.request_id)
        head = None
        if known is None:
            known = self.sent[out.request_id] = {}
            head = (out.prompt, out.prompt_token_ids)
        samples = []
        for c in out.outputs:
            nt, nl = known.get(c.index, (0, 0))
            ids = list(c.token_ids[nt:])
            lps = None if c.logprobs is None else c.logprobs[nl:]
            known[c.index] = (nt + len(ids), nl + (len(lps) if lps is not None else 0))
            samples.append((c.index, c.text, ids, lps, c.finish_reason, c.stop_reason,
                            c.cumulative_logprob))
        return OutputDelta(out.request_id, head, samples, out.num_cached_tokens, out.metrics,
                           out.deltas)

    def forget_all_but(self, live: Callable[[str], bool]) -> list[str]:
        """Drop requests no longer live (released without a finished output reaching the
        wire); their ids, for the parent to drop too."""
        gone = [rid for rid in self.sent if not live(rid)]
        for rid in gone:
            del self.sent[rid]
        return gone


class OutputMirror:
    """The parent's side: each running request's prompt, tokens and logprobs so far."""

    def __init__(self) -> None:
        self._reqs: dict[str, tuple[str | None, list[int], dict[int, tuple[list[int], list | None]]]] = {}

    def __len__(self) -> int:
        return len(self._reqs)

    def full(self, item: RequestOutput | OutputDelta) -> RequestOutput:
        if isinstance(item, RequestOutput):
            self._reqs.pop(item.request_id, None)
            return item
        req = self._reqs.get(item.request_id)
        if req is None:
            prompt, ids = item.head if item.head is not None else (None, [])
            req = self._reqs[item.request_id] = (prompt, ids, {})
        prompt, prompt_ids, samples = req
        outs = []
        for index, text, ids, lps, reason, stop, cum in item.samples:
            toks, logps = samples.setdefault(index, ([], None))
            toks.extend(ids)
            if lps is not None:
                if logps is None:  # the sample's first logprobs (a list from its first token on)
                    logps = []
                    samples[index] = (toks, logps)
                logps.extend(lps)
            outs.append(CompletionOutput(index, text, toks, reason, stop, logps, cum))
        return RequestOutput(item.request_id, prompt, prompt_ids, outs, False, item.num_cached_tokens,
                             item.metrics, item.deltas)

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self._reqs.pop(rid, None)

    def clear(self) -> None:
        self._reqs.clear()

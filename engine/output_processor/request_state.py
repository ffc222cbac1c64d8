"""What the output processor keeps per user request: text, stop strings, timings, stats.

Writer: the OutputProcessor, the only writer of a request's text, logprobs, stop-string
matches and timings. Token ids and finish status stay the core's (``Request`` and
``RequestStatus``); a ``SampleState`` only holds a read-only view of its tokens and
copies the finish the core reports. Its own finish decision is a stop string, which
it reports to the core (``stop_requests``) instead of writing it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.model_runner_output import SampledToken
from engine.core.sampling_params import SamplingParams
from engine.events.metrics.request_stats import FinishedRequestStats, FirstTokenStats
from engine.output_processor.detokenizer import IncrementalDetokenizer
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


def find_stop(text: str, num_new_chars: int, stops: Sequence[str]) -> tuple[str, int] | None:
    """The first stop string completed by the last ``num_new_chars`` of ``text``, and
    where it starts. Only the tail is searched (a match ending earlier was found
    earlier), so the cost is independent of the text's length."""
    best: tuple[str, int] | None = None
    for stop in stops:
        pos = text.find(stop, max(0, len(text) - num_new_chars - len(stop) + 1))
        if pos >= 0 and (best is None or pos < best[1]):
            best = (stop, pos)
    return best


@dataclass(slots=True)
class SampleState:
    """One sample (``n > 1`` gives several) as the user sees it."""

    index: int
    request_id: str  # the core request that produces it (a fork child has its own)
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)  # its output tokens (appended here)
    text: str = ""
    sent_text: int = 0  # chars already streamed
    sent_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0  # the core's count for this sample, as of its latest output
    logprobs: list[dict[int, float]] | None = None  # appended once per token, never copied
    cumulative_logprob: float = 0.0

    def append(self, token: SampledToken, params: SamplingParams, text: bool = True) -> str | None:
        """Add one token's text and logprobs; returns the stop string it completed.
        ``text=False``: the token id and logprobs only (a stop token's text is left out)."""
        self.token_ids.append(token.token_id)
        if token.logprob is not None:
            entry = dict(token.top_logprobs or ())
            entry[token.token_id] = token.logprob
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.append(entry)
            self.cumulative_logprob += token.logprob
        piece = self.detokenizer.add(token.token_id) if text else ""
        if not piece:
            return None
        self.text += piece
        if not params.stop:
            return None
        hit = find_stop(self.text, len(piece), params.stop)
        if hit is None:
            return None
        stop, pos = hit
        self.text = self.text[: pos + (len(stop) if params.include_stop_str_in_output else 0)]
        return stop

    def finish(self, reason: str, stop_reason: str | int | None) -> None:
        if self.finish_reason is not None:
            return
        if reason != "stop" or not isinstance(stop_reason, str):  # not cut at a stop string
            self.text += self.detokenizer.flush()
        self.finish_reason, self.stop_reason = reason, stop_reason

    def delta(self, holdback: int) -> tuple[str, list[int]] | None:
        """Text and tokens not streamed yet. While unfinished, the last ``holdback``
        chars wait: they could still turn out to start a stop string that is cut."""
        visible = len(self.text) if self.finish_reason is not None else max(
            self.sent_text, len(self.text) - holdback)
        if visible <= self.sent_text and len(self.token_ids) <= self.sent_tokens:
            return None
        out = (self.text[self.sent_text:visible], list(self.token_ids[self.sent_tokens:]))
        self.sent_text, self.sent_tokens = visible, len(self.token_ids)
        return out

    def output(self) -> CompletionOutput:
        done = self.finish_reason is not None
        return CompletionOutput(self.index, self.text, list(self.token_ids) if done else self.token_ids,
                                self.finish_reason, self.stop_reason, self.logprobs,
                                self.cumulative_logprob if self.logprobs else None)


@dataclass(slots=True)
class RequestState:
    """One user request and its samples, from add to finish."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    tokenizer: Any
    metrics: RequestMetrics
    samples: dict[int, SampleState] = field(default_factory=dict)
    num_cached_tokens: int = 0  # prefix-cache hit at first admission
    aborted: bool = False
    # chars a stream holds back when a stop string may be cut from the output (vLLM's)
    holdback: int = 0
    # core ids of samples entered as their own requests before their first output
    # (n_sharing="prefix_cache"), by sample index: an abort must finish them too
    pending_samples: dict[int, str] = field(default_factory=dict)
    prompt_logprobs: list | None = None  # RequestOutput.prompt_logprobs, grown per chunk

    def __post_init__(self) -> None:
        p = self.params
        if p.prompt_logprobs is not None:
            self.prompt_logprobs = [None]
        if p.stop and not p.include_stop_str_in_output:
            self.holdback = max(len(s) for s in p.stop) - 1
        self.sample(0, self.request_id)

    def sample(self, index: int, core_request_id: str) -> SampleState:
        """Sample ``index``, made on its first output (fork children appear at the fork)."""
        s = self.samples.get(index)
        if s is None:
            det = IncrementalDetokenizer(self.tokenizer, self.params.skip_special_tokens)
            s = self.samples[index] = SampleState(index, core_request_id, det)
        return s

    @property
    def finished(self) -> bool:
        return self.aborted or (len(self.samples) == self.params.n and all(
            s.finish_reason is not None for s in self.samples.values()))

    def expect_sample(self, index: int, core_request_id: str) -> None:
        """Sample ``index`` runs as core request ``core_request_id`` from admission on
        (vLLM v1's child requests); its ``SampleState`` is still made on its first output."""
        self.pending_samples[index] = core_request_id

    def unfinished_request_ids(self) -> list[str]:
        """Core ids of the samples still running, or entered and not yet heard from
        (what an abort must finish)."""
        return [s.request_id for s in self.samples.values() if s.finish_reason is None] + [
            rid for k, rid in self.pending_samples.items() if k not in self.samples]

    def output(self) -> RequestOutput:
        """Current state plus the deltas since the previous call."""
        deltas = {}
        for k in sorted(self.samples):
            d = self.samples[k].delta(self.holdback)
            if d is not None:
                deltas[k] = d
        outs = [self.samples[k].output() for k in sorted(self.samples)]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs,
                             self.finished, self.num_cached_tokens, self.metrics, deltas,
                             self.prompt_logprobs)

    # ---- per-request stats (vLLM v1 intervals; see engine.events.metrics.request_stats) -------

    def first_token_stats(self) -> FirstTokenStats:
        m = self.metrics
        return FirstTokenStats(self.request_id, len(self.prompt_token_ids), self.num_cached_tokens,
                               m.first_token_time - m.arrival_time)

    def finished_stats(self) -> FinishedRequestStats:
        m = self.metrics
        counts = [len(s.token_ids) for s in self.samples.values()]
        longest = max(counts, default=0)
        scheduled, first, last = m.first_scheduled_time, m.first_token_time, m.last_token_time
        decode = None if first is None else last - first
        return FinishedRequestStats(
            request_id=self.request_id,
            finish_reason=self.samples[0].finish_reason or "abort",
            num_prompt_tokens=len(self.prompt_token_ids),
            num_generation_tokens=sum(counts),
            max_num_generation_tokens=longest,
            n=self.params.n,
            max_tokens=self.params.max_tokens,
            num_cached_tokens=self.num_cached_tokens,
            num_preemptions=sum(s.num_preemptions for s in self.samples.values()),
            prefill_kv_computed_tokens=len(self.prompt_token_ids) - self.num_cached_tokens,
            e2e_s=m.finished_time - m.arrival_time,
            queued_s=None if scheduled is None else scheduled - m.arrival_time,
            prefill_s=None if first is None or scheduled is None else first - scheduled,
            decode_s=decode,
            inference_s=None if first is None or scheduled is None else last - scheduled,
            mean_time_per_output_token_s=decode / (longest - 1) if decode is not None and longest > 1 else None,
        )

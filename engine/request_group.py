"""RequestGroup: one user request and its samples (``n > 1`` forks), as the user sees it.

Writer of the texts, stop-string matches and timings of one request. Sample k
is core request ``rid`` (k = 0) or ``rid#k``; each has its own RNG stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core import SamplingParams
from engine.model.sampler import RowSampling, make_generator
from engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(slots=True)
class _Sample:
    index: int
    row: RowSampling
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent_text: int = 0  # chars already streamed
    sent_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    last_token_time: float | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0


class RequestGroup:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, base_seed: int, arrival_time: float, tokenizer,
                 device) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.base_seed = base_seed
        self.tokenizer = tokenizer
        self.device = device
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.samples: dict[int, _Sample] = {0: self._new_sample(0)}
        self.num_cached_tokens = 0

    def _new_sample(self, k: int) -> _Sample:
        p = self.params
        gen = None if p.greedy else make_generator(self.base_seed + k, self.device)
        return _Sample(k, RowSampling(p.temperature, p.top_p, p.top_k, p.min_p, p.logprobs, gen))

    @staticmethod
    def index_of(core_id: str) -> int:
        return int(core_id.split("#", 1)[1]) if "#" in core_id else 0

    def rows_for(self, core_id: str, num_samples: int) -> list[RowSampling]:
        """Sampling rows for a scheduled request; a fork point creates its samples."""
        k0 = self.index_of(core_id)
        for k in range(k0, k0 + num_samples):
            if k not in self.samples:
                self.samples[k] = self._new_sample(k)
        return [self.samples[k].row for k in range(k0, k0 + num_samples)]

    def append(self, core_id: str, sampled, now: float, ttft: list, itl: list) -> str | None:
        """Add a SampledToken; returns the stop string it completed, if any."""
        s = self.samples[self.index_of(core_id)]
        s.token_ids.append(sampled.token_id)
        if sampled.logprob is not None:
            entry = dict(sampled.top_logprobs or ())
            entry[sampled.token_id] = sampled.logprob
            s.logprobs = (s.logprobs or []) + [entry]
            s.cumulative_logprob += sampled.logprob
        if s.last_token_time is None:
            if self.metrics.first_token_time is None:
                self.metrics.first_token_time = now
                ttft.append(now - self.metrics.arrival_time)
        else:
            itl.append(now - s.last_token_time)
        s.last_token_time = self.metrics.last_token_time = now
        s.text = self.tokenizer.decode(s.token_ids, skip_special_tokens=self.params.skip_special_tokens)
        for stop in self.params.stop:
            # only the tail can hold a new match: the text grew by this token
            start = max(0, s.sent_text - len(stop) - 8)
            pos = s.text.find(stop, start)
            if pos >= 0:
                s.text = s.text[: pos + (len(stop) if self.params.include_stop_str_in_output else 0)]
                return stop
        return None

    def finish(self, core_id: str, reason: str | None, stop_reason, now: float) -> None:
        s = self.samples[self.index_of(core_id)]
        if s.finish_reason is None:
            s.finish_reason, s.stop_reason = reason, stop_reason
        if self.finished:
            self.metrics.finished_time = now

    def abort(self, now: float) -> None:
        for s in self.samples.values():
            if s.finish_reason is None:
                s.finish_reason = "abort"
        self.metrics.finished_time = now

    def unfinished_ids(self) -> list[str]:
        return [self.request_id if k == 0 else f"{self.request_id}#{k}"
                for k, s in self.samples.items() if s.finish_reason is None]

    @property
    def finished(self) -> bool:
        return len(self.samples) == self.params.n and all(
            s.finish_reason is not None for s in self.samples.values())

    def output(self) -> RequestOutput:
        """Current state plus the deltas since the previous call."""
        outs, deltas = [], {}
        for k in sorted(self.samples):
            s = self.samples[k]
            done = s.finish_reason is not None
            # hold back a trailing partial UTF-8 character until it completes
            visible = len(s.text) if done or not s.text.endswith("\ufffd") else len(s.text.rstrip("\ufffd"))
            if visible > s.sent_text or len(s.token_ids) > s.sent_tokens:
                deltas[k] = (s.text[s.sent_text:visible], s.token_ids[s.sent_tokens:])
                s.sent_text, s.sent_tokens = max(s.sent_text, visible), len(s.token_ids)
            outs.append(CompletionOutput(k, s.text, list(s.token_ids), s.finish_reason, s.stop_reason,
                                         s.logprobs, s.cumulative_logprob if s.logprobs else None))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs,
                             self.finished, self.num_cached_tokens, self.metrics, deltas)

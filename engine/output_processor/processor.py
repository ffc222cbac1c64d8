"""OutputProcessor: the core's per-step outputs → text, stop strings, timings, RequestOutputs.

vLLM v1's ``OutputProcessor``: it owns one ``RequestState`` per user request and is
the only writer of their text (incremental detokenization, O(1) amortized per token),
stop-string matches, logprobs, timings and per-request stats. A stop-string match
finishes the sample here at once (its output is final) and is reported back in
``ProcessedOutputs.reqs_to_stop``; the engine hands those ids to the scheduler, whose
next ``schedule`` finishes them and frees their blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.core_step import CoreStep
from engine.core.errors import KVScopeError
from engine.core.sampling_params import SamplingParams
from engine.events.metrics.step_metrics import LatencyObservations
from engine.events.metrics.request_stats import FinishedRequestStats, FirstTokenStats
from engine.output_processor.request_state import RequestState
from engine.outputs import RequestMetrics, RequestOutput


@dataclass(frozen=True, slots=True)
class ProcessedOutputs:
    """One step, as the user and the metrics see it.

    ``reqs_to_stop``: core request ids whose stop string matched this step (the
    scheduler finishes them at its next schedule). The stats include those of
    requests aborted between steps.
    """

    request_outputs: list[RequestOutput] = field(default_factory=list)
    reqs_to_stop: list[str] = field(default_factory=list)
    latencies: LatencyObservations = field(default_factory=LatencyObservations)
    first_tokens: list[FirstTokenStats] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}  # by user request id, until finished
        self._finished_stats: list[FinishedRequestStats] = []  # aborts, for the next step

    def new_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float) -> RequestState:
        """Build a request's state (detokenizer included) without entering it yet, so
        admission can build everything before it changes anything."""
        if request_id in self.requests:
            raise KVScopeError(f"request id {request_id!r} is already in use")
        return RequestState(request_id, prompt, prompt_token_ids, params, self.tokenizer,
                            RequestMetrics(arrival_time=arrival_time))

    def add_request(self, state: RequestState) -> None:
        assert state.request_id not in self.requests
        self.requests[state.request_id] = state

    def abort_request(self, request_id: str, now: float | None = None
                      ) -> tuple[RequestOutput, list[str]] | None:
        """Finish every sample with "abort"; returns the final output and the core ids
        the scheduler must finish (None for an unknown or finished request)."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        core_ids = state.unfinished_request_ids()
        for s in state.samples.values():
            s.finish("abort", None)
        state.aborted = True
        state.metrics.finished_time = time.time() if now is None else now
        self._finished_stats.append(state.finished_stats())
        return state.output(), core_ids

    def process_outputs(self, core: CoreStep, now: float | None = None) -> ProcessedOutputs:
        """Fold one step's core outputs into the request states; the only loop over them."""
        now = time.time() if now is None else now
        touched: dict[str, RequestState] = {}
        to_stop: list[str] = []
        ttft: list[float] = []
        itl: list[float] = []
        first_tokens: list[FirstTokenStats] = []
        for o in core.outputs:
            state = self.requests.get(o.user_request_id)
            if state is None:  # aborted, or already finished here (a stop string)
                continue
            if o.prompt_logprobs:
                state.prompt_logprobs.extend(o.prompt_logprobs)
            m = state.metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = core.scheduled_at
                state.num_cached_tokens = o.num_cached_tokens
            sample = state.sample(o.sample_index, o.request_id)
            if sample.finish_reason is not None:
                continue
            sample.num_preemptions = o.num_preemptions
            touched[state.request_id] = state
            if o.new_token is not None:
                if sample.last_token_time is None:
                    if m.first_token_time is None:
                        m.first_token_time = now
                        ttft.append(now - m.arrival_time)
                        first_tokens.append(state.first_token_stats())
                else:
                    itl.append(now - sample.last_token_time)
                sample.last_token_time = m.last_token_time = now
                # vLLM's detokenizer leaves out the text of the token that stopped the
                # request (EOS or a stop_token_ids entry) unless include_stop_str_in_output
                stopped_here = (o.finish_reason == "stop" and o.stop_token == o.new_token.token_id
                                and not state.params.include_stop_str_in_output)
                stop = sample.append(o.new_token, state.params, text=not stopped_here)
                if stop is not None:
                    sample.finish("stop", stop)
                    if o.finish_reason is None:  # still running in the core
                        to_stop.append(o.request_id)
            if o.finish_reason is not None:
                sample.finish(o.finish_reason, o.stop_token)
        outputs: list[RequestOutput] = []
        e2e: list[float] = []
        finished, self._finished_stats = self._finished_stats, []
        for rid, state in touched.items():
            if state.finished:
                state.metrics.finished_time = now
                e2e.append(now - state.metrics.arrival_time)
                finished.append(state.finished_stats())
                del self.requests[rid]
            outputs.append(state.output())
        return ProcessedOutputs(outputs, to_stop, LatencyObservations(tuple(ttft), tuple(itl), tuple(e2e)),
                                first_tokens, finished)

"""SimPod: one simulated engine: the real ``engine.core`` Scheduler and KV cache manager,
a virtual clock, and no model.

A step is the engine's own ``schedule() → update_from_output()``; the runner's part is
a token per sample id (the trace's recorded tokens, or ``placeholder_token``), and its
time comes from the ``StepCost``. Whatever the cache does (hits, evictions, preemptions,
copy-on-write) is the core's decision, the same code as ``kvscope serve`` runs.

What a router may see of a pod is ``PodView``-shaped: queue lengths and usage (what
a real router scrapes from ``/metrics``), and the KV event feed (``stored`` / ``removed``
hashes of the last finished step, what vLLM's publisher sends). Only the oracle reads
``kv.pool.cached``, the true cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter

from engine.core import (
    CacheConfig, ModelRunnerOutput, Request, RequestStatus, SampledToken, SamplingParams, Scheduler,
    SchedulerConfig,
)
from engine.core.event_log import EventLog
from engine.core.scheduler_output import SchedulerOutput
from engine.simulate.cost import StepCost
from engine.simulate.routers.base import consecutive
from engine.simulate.trace import TracedRequest, placeholder_token

ENDED_OUTSIDE = ("stop_string", "abort")  # trace finishes the engine made from outside the core
_SAMPLED: dict[int, SampledToken] = {}  # one (immutable) SampledToken per token id, shared
_SAMPLE_IDS = attrgetter("sample_ids")


@dataclass(slots=True)
class RequestTimes:
    """A simulated request's life on the virtual clock (seconds)."""

    pod: int
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int | None = None  # at its first admission (vLLM's usage figure)
    reachable_tokens: int = 0  # the longest prefix any pod held when it was admitted
    num_preemptions: int = 0


@dataclass(slots=True)
class _Live:
    trace: TracedRequest
    times: RequestTimes
    request: Request
    block_hashes: tuple[str, ...]  # what a lookup may hit, for the reachable figure


class SimPod:
    def __init__(self, index: int, sched: SchedulerConfig, cache: CacheConfig, cost: StepCost,
                 keep_events: bool = False) -> None:
        self.index = index
        self.log = EventLog(enabled=keep_events)
        self.scheduler = Scheduler(sched, cache, self.log, for_engine=False)  # no runner, no outputs
        self.kv = self.scheduler.kv
        self.cost = cost
        self.clock = 0.0  # when the pod is next free
        self.in_flight: SchedulerOutput | None = None
        self.pending: list[tuple[TracedRequest, int, RequestTimes, list[int]]] = []  # arrived mid-step
        self.live: dict[str, _Live] = {}
        # the runner's samples (``ModelRunnerOutput.sampled``, one dict kept from step to
        # step): each live request's next sample; it changes only for requests replaying
        # recorded tokens (their later samples in ``_recorded``), a placeholder stays
        self._next: dict[str, SampledToken] = {}
        self._recorded: dict[str, Iterator[SampledToken]] = {}
        self.num_steps = 0
        self._num_stored_taken = 0  # blocks stored in the feed already taken
        self.stored: list[str] = []  # the KV event feed of the step in flight
        self.removed: list[str] = []
        self.ending_outside: dict[str, _Live] = {}  # live requests a stop string or abort ends
        self._stopping: list[str] = []
        self.finished_ids: list[str] = []
        self._no_token: dict[str, RequestTimes] = {}  # live requests that sampled no token yet
        self.fleet: list[SimPod] = [self]  # every pod: where else a prefix could have hit
        self._hook_pool()

    def _hook_pool(self) -> None:
        """The KV event feed (vLLM's BlockStored / BlockRemoved): the pool appends the
        hashes to our lists, so routers get it whether or not events are kept."""
        self.kv.pool.stored, self.kv.pool.removed = self.stored, self.removed

    @property
    def num_blocks_stored(self) -> int:
        return self._num_stored_taken + len(self.stored)

    # ---- what a router sees -------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self.pending)

    @property
    def load(self) -> int:
        return self.num_running + self.num_waiting

    @property
    def num_blocks_used(self) -> int:
        return self.kv.config.num_blocks - self.kv.pool.num_free

    # ---- requests -------------------------------------------------------------------

    def arrive(self, tr: TracedRequest, index: int, times: RequestTimes, tokens: list[int],
               block_hashes: tuple[str, ...] = ()) -> None:
        """A routed request (``tokens``: its prompt): entered now when the pod is between
        steps, else at the end of the step in flight (the engine adds requests between steps)."""
        if self.in_flight is not None:
            self.pending.append((tr, index, times, tokens, block_hashes))
        else:
            self._enter(tr, index, times, tokens, block_hashes)

    def _enter(self, tr: TracedRequest, index: int, times: RequestTimes, tokens: list[int],
               block_hashes: tuple[str, ...] = ()) -> None:
        n = tr.output_length
        stop_ids: list[int] = []
        if tr.finish == "stop":  # its last token stopped it: the same finish event
            stop_ids = [tr.output_token_ids[-1]]
        elif tr.finish in ENDED_OUTSIDE:
            n += 1  # ended from outside before it could sample more
        params = SamplingParams(max_tokens=n, min_tokens=tr.output_length if stop_ids else 0,
                                stop_token_ids=stop_ids, ignore_eos=True, temperature=0)
        req = Request(tr.request_id, tokens, params, arrival_time=times.arrival, client=tr.client)
        self.scheduler.add_request(req)
        if block_hashes:  # the router hashed them already
            self.kv.give_block_hashes(req.request_id, block_hashes)
        times.num_prompt_tokens = len(tokens)
        live = self.live[tr.request_id] = _Live(tr, times, req, block_hashes)
        self._next[tr.request_id], later = _samples(tr, index)
        if later is not None:
            self._recorded[tr.request_id] = later
        self._no_token[tr.request_id] = times
        if tr.finish in ENDED_OUTSIDE:
            self.ending_outside[tr.request_id] = live

    def end_from_outside(self, request_id: str, how: str) -> None:
        """Before the next schedule: a stop string (finished at that schedule) or an abort."""
        if request_id not in self.scheduler.requests:
            return
        if how == "stop_string":
            self.scheduler.stop_requests([request_id])
            self._stopping.append(request_id)
        else:
            self.scheduler.finish_request(request_id, RequestStatus.FINISHED_ABORTED)
            self._finished(request_id)

    def _finished(self, request_id: str) -> None:
        live = self.live.pop(request_id)
        del self._next[request_id]
        self._recorded.pop(request_id, None)
        self.ending_outside.pop(request_id, None)
        self._no_token.pop(request_id, None)
        t = live.times
        t.finished = self.clock
        t.num_output_tokens = live.request.num_output_tokens
        t.num_preemptions = live.request.num_preemptions
        self.finished_ids.append(request_id)

    def take_finished(self) -> list[str]:
        """The requests that ended since the last call (their response streams closed)."""
        out, self.finished_ids = self.finished_ids, []
        return out

    def busy(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.log.events)

    # ---- one step ---------------------------------------------------------------------

    def start_step(self, now: float) -> float:
        """Schedule a step at ``now``; returns when it ends."""
        self.clock = max(self.clock, now)
        out = self.scheduler.schedule()
        for rid in self._stopping:  # stop strings: finished by this schedule
            self._finished(rid)
        self._stopping.clear()
        for new in out.new_requests:  # first admissions (n = 1): vLLM's cached_tokens
            live = self.live[new.request_id]
            t = live.times
            if t.first_scheduled is None:
                t.first_scheduled = self.clock
                t.num_cached_tokens = live.request.num_cached_tokens
                t.reachable_tokens = max([t.num_cached_tokens] + [
                    consecutive(live.block_hashes, q.kv.pool.cached) * q.kv.block_size
                    for q in self.fleet if q is not self])
        self.in_flight = out
        self.clock += self.cost.of(out)
        return self.clock

    def finish_step(self) -> None:
        """Close the step in flight at ``clock``: sample, update, enter the requests that
        arrived meanwhile. The runner's output is the pod's dict of next samples, as it is
        (each scheduled sample id has one); only requests replaying recorded tokens move
        on to their next one, so a trace of placeholders costs no Python per sample."""
        out, self.in_flight = self.in_flight, None
        sids = list(chain.from_iterable(map(_SAMPLE_IDS, out.scheduled)))
        requests = self.scheduler.requests
        before = len(requests)
        self.scheduler.update_from_output(out, ModelRunnerOutput(self._next))  # outputs: none
        self.num_steps += 1
        recorded = self._recorded
        if recorded:
            nxt = self._next
            for rid in recorded.keys() & sids:
                nxt[rid] = next(recorded[rid])
        no_token = self._no_token
        if no_token:
            clock = self.clock
            for rid in no_token.keys() & sids:
                no_token.pop(rid).first_token = clock
        if len(requests) < before:  # finished by this update (in the order they sampled)
            for rid in sids:
                if rid not in requests:
                    self._finished(rid)
        pending, self.pending = self.pending, []
        for item in pending:
            self._enter(*item)

    def take_feed(self) -> tuple[list[str], list[str]]:
        """The KV event feed since the last call (stored, removed hashes)."""
        stored, removed, self.stored, self.removed = self.stored, self.removed, [], []
        self._num_stored_taken += len(stored)
        self._hook_pool()
        return stored, removed


def _sampled(token_id: int) -> SampledToken:
    tok = _SAMPLED.get(token_id)
    if tok is None:
        tok = _SAMPLED[token_id] = SampledToken(token_id)
    return tok


def _samples(tr: TracedRequest, index: int) -> tuple[SampledToken, Iterator[SampledToken] | None]:
    """What the runner samples for the request: the trace's recorded tokens (as many as it
    can sample: its output length, +1 for an abort's), then its placeholder
    (``placeholder_token``) at every later position. Returns the first sample and the
    later ones, None when every sample is the placeholder. One SampledToken per token id."""
    placeholder = _sampled(placeholder_token(index))
    ids = (tr.output_token_ids or ())[:tr.output_length + 1]
    if not ids:
        return placeholder, None
    later = chain(map(_sampled, ids), repeat(placeholder))
    return next(later), later

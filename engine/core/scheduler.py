"""Scheduler: spends a token budget each step; chunked prefill; preemption by recompute.

Writer of request status and counters, and of the waiting/running queues. Each
engine step is ``schedule() → (runner executes) → update_from_output()``.
There is no prefill phase: every request just closes the gap
``num_computed_tokens → num_tokens``. Running requests go first (decodes and
unfinished chunks, in arrival order), then waiting ones (FCFS). When blocks run
out, the most recently arrived running request is preempted: its blocks are
freed and it goes back to the front of ``waiting`` to be recomputed.
"""

from __future__ import annotations

import bisect
from collections import deque

from engine.core.config import CacheConfig, SchedulerConfig, check_capacity
from engine.core.errors import PromptTooLongError, QueueFullError
from engine.core.event_log import EventLog
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from engine.core.snapshot import build_snapshot, summarize_pool
from engine.events.pool_snapshot import PoolSnapshot
from engine.events.pool_summary import PoolSummary
from engine.events.types import (
    RequestArrived, RequestFinished, RequestPreempted, RequestProgress, RequestScheduled,
    ScheduledPhase,
)


class Scheduler:
    def __init__(self, sched: SchedulerConfig, cache: CacheConfig, log: EventLog | None = None) -> None:
        check_capacity(cache, sched)
        self.config = sched
        self.cache_config = cache
        self.log = log or EventLog()
        self.kv = KVCacheManager(cache, self.log)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.step = 0  # last scheduled step; events logged now belong to step + 1
        self.log.step = 1
        self.num_preemptions = 0
        self._next_arrival = 0

    # ---- requests in and out -----------------------------------------------

    def add_request(self, req: Request) -> None:
        """Queue a new request; raises for a prompt that cannot fit or a full queue."""
        n, limit = req.num_prompt_tokens, self.config.max_model_len
        if n == 0:
            raise PromptTooLongError("the prompt is empty; give at least one token")
        if n >= limit:
            raise PromptTooLongError(
                f"the prompt has {n} tokens but max_model_len is {limit} (room is needed for at "
                f"least one generated token); shorten the prompt or raise max_model_len"
            )
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        if self.config.max_waiting and len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({self.config.max_waiting} requests); retry later"
            )
        req.arrival_index = self._next_arrival
        self._next_arrival += 1
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)
        self.log.add(RequestArrived(self.log.step, req.request_id, n, tuple(req.prompt_token_ids),
                                    req.arrival_index))

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish (stop string) or abort a request wherever it is; frees its blocks."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        assert status.is_finished
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.kv.free(req)
        self.log.add(RequestFinished(self.log.step, request_id, status.finish_reason))
        return req

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step -----------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        self.step = self.log.step
        budget = self.config.max_num_batched_tokens
        thr = self.config.long_prefill_token_threshold
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if thr:
                n = min(n, thr)
            assert n > 0, f"running request {req.request_id} has nothing to compute"
            while not self.kv.allocate_slots(req, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append(self._scheduled(req, n))
                budget -= n
                i += 1

        while (not preempted and self.waiting and budget > 0
               and len(self.running) < self.config.max_num_seqs):
            req = self.waiting[0]
            match = self.kv.lookup(req)
            n = req.num_tokens - match.num_tokens
            if not self.config.enable_chunked_prefill and n > budget:
                break  # the whole prompt runs in one step, or waits
            n = min(n, budget, thr) if thr and self.config.enable_chunked_prefill else min(n, budget)
            if not self.kv.allocate_slots(req, n, match):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = req.num_cached_tokens = match.num_tokens
            bisect.insort(self.running, req, key=lambda r: r.sort_key)
            scheduled.append(self._scheduled(req, n))
            budget -= n

        return SchedulerOutput(self.step, scheduled, self.kv.take_cow_pairs(), preempted,
                               self.config.max_num_batched_tokens)

    def _scheduled(self, req: Request, n: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        end = start + n
        decode = n == 1 and req.num_output_tokens > 0 and end == req.num_tokens
        samples = 0
        if end == req.num_tokens:
            samples = req.params.n if (req.params.n > 1 and not req.forked) else 1
        phase = ScheduledPhase.DECODE if decode else ScheduledPhase.PREFILL
        self.log.add(RequestScheduled(self.step, req.request_id, n, phase, start))
        return ScheduledRequest(req.request_id, req.token_ids[start:end], start,
                                self.kv.block_ids(req.request_id),
                                self.kv.slot_mapping(req, start, end), samples, phase)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.log.add(RequestPreempted(self.step, req.request_id))

    def update_from_output(self, out: SchedulerOutput,
                           sampled: dict[str, list[int]]) -> tuple[list[Request], list[Request]]:
        """Append sampled tokens, fork ``n > 1`` requests, finish the done ones.

        ``sampled[rid]`` holds ``num_samples`` tokens (sample k goes to fork child
        k). Returns (new fork children, finished requests). The caller may still
        finish requests (stop strings), then calls ``end_step``.
        """
        self.kv.step_computed()
        children: list[Request] = []
        finished: list[Request] = []
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None:  # aborted between schedule and update
                continue
            req.num_computed_tokens += s.num_new_tokens
            toks = sampled.get(s.request_id, [])
            assert len(toks) == s.num_samples, (s.request_id, toks, s.num_samples)
            group = [req]
            if s.num_samples > 1:
                req.forked = True
                for k in range(1, s.num_samples):
                    child = req.fork(k)
                    self.requests[child.request_id] = child
                    self.kv.fork(req, child)
                    bisect.insort(self.running, child, key=lambda r: r.sort_key)
                    children.append(child)
                    group.append(child)
            for r, tok in zip(group, toks):
                r.token_ids.append(tok)
                self.log.add(RequestProgress(self.step, r.request_id, r.num_tokens,
                                             r.num_computed_tokens, (tok,)))
                if self._check_stop(r, tok):
                    finished.append(r)
            if not toks:
                self.log.add(RequestProgress(self.step, req.request_id, req.num_tokens,
                                             req.num_computed_tokens, ()))
        for r in finished:
            self.finish_request(r.request_id, r.status)
        return children, finished

    def end_step(self) -> None:
        """Close the step: events logged from now on belong to the next one."""
        self.log.step = self.step + 1

    def _check_stop(self, req: Request, tok: int) -> bool:
        p = req.params
        out_len = req.num_output_tokens
        if out_len >= p.min_tokens:
            if (not p.ignore_eos and tok in req.eos_token_ids) or tok in p.stop_token_ids:
                req.status, req.stop_token = RequestStatus.FINISHED_STOPPED, tok
                return True
        if (p.max_tokens is not None and out_len >= p.max_tokens) or \
                req.num_tokens >= self.config.max_model_len:
            req.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def pool_summary(self) -> PoolSummary:
        """The counts per-step metrics need; far cheaper than ``snapshot()``."""
        return summarize_pool(self.step, self.kv, self.requests.values())

    def snapshot(self, tokens: bool = True) -> PoolSnapshot:
        """The engine's true pool and request state (the protocol's snapshot shape)."""
        return build_snapshot(self.step, self.kv, self.requests.values(), tokens)

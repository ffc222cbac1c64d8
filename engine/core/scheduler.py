"""Scheduler: spends a token budget each step; chunked prefill; preemption by recompute.

Past 300 lines on purpose: ``schedule`` and ``update_from_output`` are one state machine
over the same queues and request states (the only writer of both), as vLLM's
``vllm/v1/core/sched/scheduler.py`` is; the policies that can stand alone already do
(``fair_share``, ``parallel_sampling``, ``miss_causes``).

Writer of request status, counters and tokens, and of the waiting/running queues.
Each engine step is ``schedule() → (runner executes) → update_from_output()``.
There is no prefill phase: every request just closes the gap
``num_computed_tokens → num_tokens``. Running requests go first (decodes and
unfinished chunks, in arrival order), then waiting ones (FCFS). When blocks run
out, the most recently arrived running request is preempted: its blocks are
freed and it goes back to the front of ``waiting`` to be recomputed. That is the
"fcfs" policy (vLLM's); "fair" (``SchedulerConfig.policy``, ``kvscope serve``'s
default) changes the order and splits each step between clients: see
``engine.core.config.SCHEDULING_POLICIES``, ``engine.core.fair_share`` and ``_rebalance``.

``n > 1`` (``SchedulerConfig.n_sharing``): "cow" forks the request at its first sample
(``Request.fork``, ``KVCacheManager.fork``: every block shared, copy-on-write later);
"prefix_cache" enters its n samples as separate requests at admission
(``engine.core.parallel_sampling``), sharing full prompt blocks through the prefix cache.

The step clock: ``EventLog.step`` is the one counter (the step events logged now
belong to); only the Scheduler advances it, when ``update_from_output`` closes a
step. ``Scheduler.step`` (the last scheduled step) and the engine's ``StepRecord.seq``
(``step - 1``) are derived from it.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterator
from operator import attrgetter

from engine.core.config import CacheConfig, SchedulerConfig, check_capacity, check_prompt_length
from engine.core.core_step import CoreStep, EngineCoreOutput
from engine.core.errors import QueueFullError
from engine.core.event_log import EventLog
from engine.core.fair_share import StepShares, client_counts, fair_first, fair_iter, fair_order
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.model_runner_output import ModelRunnerOutput
from engine.core.parallel_sampling import fan_out
from engine.core.request import Request, RequestStatus, child_request_id
from engine.core.scheduler_output import NewRequestData, ScheduledRequest, SchedulerOutput
from engine.core.snapshot import build_snapshot, summarize_pool
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.metrics.pool_summary import PoolSummary
from engine.events.schema.types import (
    RequestArrived, RequestFinished, RequestPreempted, RequestProgress, RequestScheduled,
    ScheduledPhase,
)


_PHASE, _TOKENS = attrgetter("phase"), attrgetter("token_ids")
_DECODE, _PREFILL = ScheduledPhase.DECODE, ScheduledPhase.PREFILL
_NO_RUNNER: list[int] = []  # block_table and slot_mapping without a runner (never written)


class Scheduler:
    def __init__(self, sched: SchedulerConfig, cache: CacheConfig, log: EventLog | None = None,
                 for_engine: bool = True) -> None:
        """``for_engine=False``: no model runner reads the steps and no output processor
        their outputs (``kvscope simulate``, which reads the requests themselves). Each
        ``ScheduledRequest``'s ``block_table`` and ``slot_mapping`` are left empty and
        ``update_from_output`` returns no ``EngineCoreOutput``s, rather than building them
        for every scheduled request of every step. The core's decisions are the same."""
        check_capacity(cache, sched)
        self.for_engine = for_engine
        self.config = sched
        self.cache_config = cache
        self.log = log or EventLog()
        self.kv = KVCacheManager(cache, self.log)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.log.step = 1  # the step clock (see the module docstring)
        self.num_preemptions = 0
        self._next_arrival = 0
        self._finished_ids: list[str] = []  # finished since the last schedule: the runner drops them
        self._stop_next: list[str] = []  # stop-string finishes, applied by the next schedule
        self._new: list[NewRequestData] = []  # the step being scheduled: sampling state to send
        self._open = False  # between schedule() and the update that closes the step

    @property
    def step(self) -> int:
        """The last scheduled step (the one a snapshot or pool summary taken now shows)."""
        return self.log.step if self._open else self.log.step - 1

    # ---- requests in and out -----------------------------------------------

    def add_request(self, req: Request) -> list[Request]:
        """Queue a new request; raises for a prompt that cannot fit or a full queue, and
        then changes nothing. Returns the requests entered: ``req`` alone, or with
        ``n_sharing="prefix_cache"`` and ``n > 1`` its n samples as separate requests
        (``engine.core.parallel_sampling``), in arrival order."""
        n = req.num_prompt_tokens
        check_prompt_length(n, self.config.max_model_len)
        fan = self.config.n_sharing == "prefix_cache" and req.params.n > 1
        ids = [req.request_id] + ([child_request_id(req.request_id, k)
                                   for k in range(1, req.params.n)] if fan else [])
        taken = [i for i in ids if i in self.requests]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in use")
        if self.config.max_waiting and len(self.waiting) + len(ids) > self.config.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({self.config.max_waiting} requests"
                + (f"; this one needs room for its {len(ids)} samples" if fan else "")
                + "); retry later"
            )
        entered = fan_out(req) if fan else [req]
        for r in entered:
            r.arrival_index = self._next_arrival
            self._next_arrival += 1
            r.status = RequestStatus.WAITING
            self.requests[r.request_id] = r
            self.waiting.append(r)
            if self.log.enabled:  # counted by nothing: built only to be kept
                self.log.add(RequestArrived(self.log.step, r.request_id, n, tuple(r.prompt_token_ids),
                                            r.arrival_index, r.parent_id))
        return entered

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """Finish or abort a request now, wherever it is; frees its blocks."""
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
        self._finished_ids.append(request_id)
        self.log.add(RequestFinished(self.log.step, request_id, status.finish_reason))
        return req

    def stop_requests(self, request_ids: list[str]) -> None:
        """Finish these (stop strings the output processor matched) at the next schedule,
        as vLLM does: the step that produced the text has already been computed."""
        self._stop_next.extend(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- one step -----------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        stops, self._stop_next = self._stop_next, []
        for rid in stops:
            self.finish_request(rid, RequestStatus.FINISHED_STOPPED)
        self._new = []
        self._open = True
        budget = self.config.max_num_batched_tokens
        thr = self.config.long_prefill_token_threshold
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []

        fair = self.config.policy == "fair"
        rebalanced = self._rebalance(budget) if fair else []
        shares = StepShares.split(self.running, self.waiting, budget, self.config.max_num_seqs,
                                  self.config.fair_ratio) if fair else None
        order = fair_order(self.running) if fair else list(self.running)
        extend = self.kv.extend_slots  # allocate_slots of an admitted request (no match)
        i = 0
        while i < len(order) and budget > 0:
            req = order[i]
            n = len(req.token_ids) - req.num_computed_tokens
            if n > budget:
                n = budget
            if thr and n > thr:
                n = thr
            assert n > 0, f"running request {req.request_id} has nothing to compute"
            if shares is not None:
                if not shares.open(req.client):
                    i += 1  # its client's share of this step is spent: it waits a step
                    continue
                n = min(n, shares.tokens[req.client])
            while not extend(req, n):
                victim = order.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled.append(self._scheduled(req, n))
                budget -= n
                if shares is not None:
                    shares.spend(req.client, n)
                i += 1

        waiting_clients = {r.client for r in self.waiting} if shares is not None else ()
        for req in self._waiting_order() if fair else self._fcfs_heads():
            if preempted or budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if shares is not None and not shares.open(req.client):
                if not any(map(shares.open, waiting_clients)):
                    break  # every waiting client's share is spent: the rest would all be skipped
                continue  # its client's share is spent; another client's may not be
            room = budget if shares is None else min(budget, shares.tokens[req.client])
            match = self.kv.lookup(req, classify=False)  # classified if admitted
            n = req.num_tokens - match.num_tokens
            if not self.config.enable_chunked_prefill and n > room:
                if room < budget:
                    continue  # this client's share cannot take the whole prompt this step
                break  # the whole prompt runs in one step, or waits
            n = min(n, room, thr) if thr and self.config.enable_chunked_prefill else min(n, room)
            if not self.kv.allocate_slots(req, n, match):
                break
            if self.waiting[0] is req:
                self.waiting.popleft()
            else:
                self.waiting.remove(req)
            if req.status is RequestStatus.WAITING:  # first admission: the runner meets it now
                self._new.append(NewRequestData(req.request_id, req.params, req.seed))
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = req.num_cached_tokens = match.num_tokens
            bisect.insort(self.running, req, key=lambda r: r.sort_key)
            scheduled.append(self._scheduled(req, n))
            budget -= n
            if shares is not None:
                shares.spend(req.client, n)

        if not self.log.enabled:  # the request_scheduled counts of the step, none built
            decode = list(map(_PHASE, scheduled)).count(_DECODE)  # a token each
            counts = self.log.counts
            counts.count_scheduled(_DECODE, decode)
            counts.count_scheduled(_PREFILL, sum(map(len, map(_TOKENS, scheduled))) - decode)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(self.log.step, scheduled, self.kv.take_cow_pairs(), rebalanced + preempted,
                               self.config.max_num_batched_tokens, self._new, finished, time.time())

    def _scheduled(self, req: Request, n: int) -> ScheduledRequest:
        start = req.num_computed_tokens
        end = start + n
        tokens = req.token_ids
        rid, params = req.request_id, req.params
        sample_ids: tuple[str, ...] = ()
        phase = _PREFILL
        if end == len(tokens):
            sample_ids = (rid,)
            if n == 1 and end > len(req.prompt_token_ids):  # one token past the prompt
                phase = _DECODE
            if params.n > 1 and not req.forked:  # the fork point: children sample too
                for k in range(1, params.n):
                    cid = child_request_id(rid, k)
                    self._new.append(NewRequestData(cid, params, req.child_seed(k)))
                    sample_ids += (cid,)
        log = self.log
        if log.enabled:  # (else ``schedule`` counts the step's entries at once)
            log.add(RequestScheduled(log.step, rid, n, phase, start))
        # prompt logprobs: position p's logits score prompt token p + 1; sample 0 reports
        # them (the user's request; its samples share its prompt), each position once
        first, targets = req.num_prompt_logprobs, ()
        if first < start:
            first = start
        if params.prompt_logprobs is not None and req.sample_index == 0:
            targets = tuple(req.prompt_token_ids[first + 1:min(end, req.num_prompt_tokens - 1) + 1])
        if self.for_engine:
            table, slots = self.kv.block_ids(rid), self.kv.slot_mapping(req, start, end)
        else:
            table = slots = _NO_RUNNER
        return ScheduledRequest(rid, tokens[start:end], start, table, slots, sample_ids, phase, targets, first)

    # ---- the order requests are served in (SchedulerConfig.policy) ----------

    def _fcfs_heads(self):
        """Waiting requests in the queue's own order (arrival; preempted ones back at the
        front), one head at a time: admission pops each, and stops at the first it
        cannot admit. No copy of the queue per step."""
        while self.waiting:
            head = self.waiting[0]
            yield head
            if self.waiting and self.waiting[0] is head:
                return  # not admitted: FCFS waits at the head

    def _waiting_order(self) -> Iterator[Request]:
        """Under "fair": each waiting request ranked after what its client already runs,
        so the client running fewest sequences is admitted first (lazily: admission
        stops early, the queue may be long)."""
        return fair_iter(self.waiting, client_counts(self.running))

    def _rebalance(self, budget: int) -> list[str]:
        """Under "fair": while the next waiting request cannot get a seat (``max_num_seqs``)
        or its first chunk's blocks, and some client runs more sequences than that
        request's client would after admission, preempt that client's newest running
        request (recomputed later, as any preemption). Returns the preempted ids.

        Strictly more, so two clients with equal shares never trade seats back and
        forth; with one client nothing is ever preempted here, and "fair" is "fcfs"."""
        preempted: list[str] = []
        while self.waiting and self.running:
            held = client_counts(self.running)
            cand = fair_first(self.waiting, held)
            cand_rank = held.get(cand.client, 0)
            victim = max(self.running, key=lambda r: (held[r.client], r.sort_key))
            if held[victim.client] - 1 <= cand_rank:
                break  # nobody holds more than cand's client would: fair already
            short_seat = len(self.running) >= self.config.max_num_seqs
            match = self.kv.lookup(cand, classify=False)  # pure: admission looks again, and records that one
            first_chunk = max(1, min(cand.num_tokens - match.num_tokens, budget))
            short_blocks = self.kv.blocks_needed(cand, first_chunk, match) > self.kv.pool.num_free
            if not (short_seat or short_blocks):
                break
            self._preempt(victim)
            preempted.append(victim.request_id)
        return preempted

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.log.add(RequestPreempted(self.log.step, req.request_id))

    def update_from_output(self, out: SchedulerOutput,
                           model_output: ModelRunnerOutput) -> CoreStep:
        """Append sampled tokens, fork ``n > 1`` requests, finish the done ones, and
        close the step (events logged from now on belong to the next one).

        ``model_output.sampled`` holds a token for each id in a scheduled request's
        ``sample_ids``; at a fork point, sample k's token goes to child k, made here.
        Returns one entry per scheduled request (fork children included), none when the
        scheduler is not ``for_engine``.
        """
        self.kv.step_computed()
        log = self.log
        step, keep = log.step, log.enabled
        requests, sampled = self.requests, model_output.sampled
        outputs: list[EngineCoreOutput] = []
        build = self.for_engine  # else nobody reads the outputs: none are built
        finished: list[Request] = []
        num_sampled = 0  # request_progress tokens, counted once for the step when not kept
        for s in out.scheduled:
            req = requests.get(s.request_id)
            if req is None:  # aborted between schedule and update
                continue
            req.num_computed_tokens += len(s.token_ids)
            plp = model_output.prompt_logprobs.get(req.request_id) if s.prompt_logprob_targets else None
            if plp is not None:
                req.num_prompt_logprobs = s.prompt_logprobs_from + len(plp)
            sample_ids = s.sample_ids
            if not sample_ids:
                self._progress(step, req, ())
                if build:
                    outputs.append(self._core_output(req, None, plp))
                continue
            samples = (req,) if len(sample_ids) == 1 else [req]
            if len(sample_ids) > 1:
                req.forked = True
                for k, cid in enumerate(sample_ids[1:], start=1):
                    child = req.fork(k)
                    assert child.request_id == cid, (child.request_id, cid)
                    requests[cid] = child
                    self.kv.fork(req, child)
                    bisect.insort(self.running, child, key=lambda r: r.sort_key)
                    samples.append(child)
            for r in samples:
                tok = sampled[r.request_id]
                tid = tok.token_id
                r.token_ids.append(tid)  # (the only place a request's tokens grow)
                if keep:
                    self._progress(step, r, (tid,))
                else:
                    num_sampled += 1
                done = self._check_stop(r, tid)
                if done:
                    finished.append(r)
                if build:
                    outputs.append(self._core_output(r, tok, plp if r is req else None, done))
        if num_sampled:
            log.counts.count_progress(num_sampled)
        for r in finished:
            self.finish_request(r.request_id, r.status)
        log.step, self._open = step + 1, False  # close the step: the clock's only tick
        return CoreStep(step, out.timestamp, outputs)

    @staticmethod
    def _core_output(r: Request, tok, prompt_logprobs=None, done: bool = False) -> EngineCoreOutput:
        """``done``: ``_check_stop`` finished it this step (the only way a request still in
        ``requests`` at the update is finished)."""
        return EngineCoreOutput(
            r.request_id, r.parent_id, r.sample_index, tok, r.status.finish_reason if done else None,
            r.stop_token if done else None, r.num_cached_tokens, r.num_preemptions, prompt_logprobs)

    def _check_stop(self, req: Request, tok: int) -> bool:
        p = req.params
        n = len(req.token_ids)
        out_len = n - len(req.prompt_token_ids)
        if out_len >= p.min_tokens and (tok in p.stop_token_ids or (not p.ignore_eos and tok in req.eos_token_ids)):
            req.status, req.stop_token = RequestStatus.FINISHED_STOPPED, tok
            return True
        if n >= self.config.max_model_len or (p.max_tokens is not None and out_len >= p.max_tokens):
            req.status = RequestStatus.FINISHED_LENGTH
            return True
        return False

    def _progress(self, step: int, r: Request, new_token_ids: tuple[int, ...]) -> None:
        """The step's ``request_progress`` of ``r`` (counted only, when events are not kept)."""
        log = self.log
        if log.enabled:
            log.add(RequestProgress(step, r.request_id, len(r.token_ids), r.num_computed_tokens,
                                    new_token_ids))
        else:
            log.counts.count_progress(len(new_token_ids))

    def pool_summary(self) -> PoolSummary:
        """The counts per-step metrics need; far cheaper than ``snapshot()``."""
        return summarize_pool(self.step, self.kv, self.running, self.waiting)

    def snapshot(self, tokens: bool = True) -> PoolSnapshot:
        """The engine's true pool and request state (the protocol's snapshot shape)."""
        return build_snapshot(self.step, self.kv, self.requests.values(), tokens)

"""Run a trace through N simulated pods behind a router, on a virtual clock.

Two ways arrivals enter:
- ``times`` (any number of pods): each request arrives at its trace time; the router
  picks its pod then, from what it may see; a pod busy with a step enters it when the
  step ends, as the engine adds requests between steps. Events in time order, arrivals
  before step ends at the same instant.
- ``steps`` (one pod, an engine run's trace): each request enters before the engine
  step it entered before in the recording, and is ended from outside (abort, stop
  string) before the step it was in the recording. With the run's settings the core
  then makes the recording's every decision again: the fidelity test holds it.

A recorder (``engine.store.Recorder``) makes each pod a run of kind ``simulated``: its
steps' events and metrics, as an engine run's, so Replay and Compare show it.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from engine.core import CacheConfig, SchedulerConfig
from engine.core.hashing import get_hasher
from engine.events.metrics.step_metrics import MetricsConfig, MetricsTracker
from engine.events.schema.step import StepRecord
from engine.simulate.cost import StepCost
from engine.simulate.pod import RequestTimes, SimPod
from engine.simulate.prompt_feed import PromptFeed, worth_a_process
from engine.simulate.prompt_hashes import PromptHashes
from engine.simulate.routers import ROUTERS, Routed
from engine.simulate.trace import Trace, TracedRequest

ARRIVALS = ("times", "steps")


@dataclass
class SimConfig:
    num_pods: int
    router: str
    sched: SchedulerConfig
    cache: CacheConfig
    cost: StepCost
    arrivals: str = "times"
    keep_events: bool = False  # needed to record the runs
    miss_causes: bool = False  # True: split misses into cold / evicted / partial (a recording always does)
    router_args: dict = field(default_factory=dict)  # e.g. Dynamo's overlap_weight
    record_pods: tuple[int, ...] | None = None  # recording: these pods' events only (None: all)

    def __post_init__(self) -> None:
        if not isinstance(self.num_pods, int) or self.num_pods < 1:
            raise ValueError(f"pods must be an integer >= 1, got {self.num_pods!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown router {self.router!r} (known: {', '.join(ROUTERS)})")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {ARRIVALS}, got {self.arrivals!r}")
        if self.arrivals == "steps" and self.num_pods != 1:
            raise ValueError("arrivals by steps replay one engine run on one pod (--pods 1)")
        if self.record_pods is not None:
            bad = [k for k in self.record_pods if not isinstance(k, int) or not 0 <= k < self.num_pods]
            if bad or not self.record_pods:
                raise ValueError(f"recorded pods must be pod numbers 0..{self.num_pods - 1}, "
                                 f"got {list(self.record_pods)!r}")
            self.record_pods = tuple(sorted(set(self.record_pods)))

    def recorded(self, pod: int) -> bool:
        return self.record_pods is None or pod in self.record_pods


@dataclass
class SimResult:
    config: SimConfig
    pods: list[SimPod]
    requests: list[RequestTimes]
    trace: Trace
    run_ids: list[str] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max((p.clock for p in self.pods), default=0.0)


class _Recording:
    """Each recorded pod's steps as a ``simulated`` run, written through a Recorder. With
    ``record_pods`` only those pods are runs: every event of theirs, none of the others'
    (each run's config says which pods of the fleet were kept, and its label too)."""

    def __init__(self, recorder: Any, cfg: SimConfig, pods: list[SimPod], trace: Trace, label: str | None):
        self.recorder = recorder
        self.trackers: dict[int, MetricsTracker] = {}
        self.run_ids: dict[int, str] = {}
        self.seq = [0] * len(pods)
        kept = list(range(cfg.num_pods)) if cfg.record_pods is None else list(cfg.record_pods)
        some = "" if len(kept) == cfg.num_pods else f" (recorded: pod{'s' * (len(kept) > 1)} " \
            f"{', '.join(map(str, kept))} of {cfg.num_pods})"
        for p in pods:
            if not cfg.recorded(p.index):
                continue
            conf = {"num_blocks": cfg.cache.num_blocks, "block_size": cfg.cache.block_size,
                    "max_num_batched_tokens": cfg.sched.max_num_batched_tokens,
                    "max_num_seqs": cfg.sched.max_num_seqs, "max_model_len": cfg.sched.max_model_len,
                    "enable_prefix_caching": cfg.cache.enable_prefix_caching,
                    "scheduling_policy": cfg.sched.policy, "simulated": {
                        "trace": trace.source, "pod": p.index, "pods": cfg.num_pods,
                        "router": cfg.router, "arrivals": cfg.arrivals, "step_cost": cfg.cost.to_dict(),
                        "recorded_pods": kept}}
            name = f"{label or 'simulate'} pod {p.index}/{cfg.num_pods}{some}"
            self.run_ids[p.index] = recorder.start_run(conf, model=None, label=name, kind="simulated")
            self.trackers[p.index] = MetricsTracker(MetricsConfig(
                cfg.cache.block_size, cfg.cache.num_blocks, cfg.sched.max_num_batched_tokens))

    def step(self, pod: SimPod) -> None:
        events = pod.log.drain()
        k = pod.index
        summary = pod.scheduler.pool_summary()
        metrics = self.trackers[k].update(events, summary, pod.clock)
        rec = StepRecord(self.seq[k], summary.step, pod.clock, events, metrics)
        self.seq[k] += 1
        self.recorder.record_step(rec, self.run_ids[k])

    def finish(self, result: SimResult) -> None:
        for tr, t in zip(result.trace.requests, result.requests):
            if t.pod not in self.run_ids:
                continue
            self.recorder.record_request(
                tr.request_id, prompt=f"({tr.num_prompt_tokens} prompt tokens, simulated)",
                params={"max_tokens": tr.output_length},
                outputs=[], timings={"num_cached_tokens": t.num_cached_tokens, "ttft_s": _sub(t.first_token, t.arrival),
                                     "e2e_s": _sub(t.finished, t.arrival)},
                run_id=self.run_ids[t.pod], source="simulate")
        for rid in self.run_ids.values():
            self.recorder.finish(rid)


def _sub(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


class SharedPrompts:
    """What every run of one trace shares (a sweep): each request's prompt tokens, and its
    prompt hashes per block size and hash algorithm, each made once (``prepare``, before a
    sweep forks its workers: they inherit them rather than make them again) and read by
    every run; the same tokens and hashes a run would make (a Mooncake prompt is made
    from its hash ids, not kept in the trace)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.tokens: list[list[int]] | None = None
        self.hashes: dict[tuple[int, str], list[tuple[str, ...]]] = {}

    def prepare(self, cfgs: list[SimConfig]) -> SharedPrompts:
        for cfg in cfgs:
            if cfg.arrivals == "times":
                self.hashes_for(cfg.cache)
        return self

    def prompts(self) -> list[list[int]]:
        if self.tokens is None:
            self.tokens = [tr.tokens() for tr in self.trace.requests]
        return self.tokens

    def hashes_for(self, cache: CacheConfig) -> list[tuple[str, ...]]:
        key = (cache.block_size, cache.prefix_caching_hash_algo)
        if key not in self.hashes:
            prompt_hashes = PromptHashes(get_hasher(key[1]), key[0])
            self.hashes[key] = list(map(prompt_hashes, self.trace.requests, self.prompts()))
        return self.hashes[key]


def simulate(trace: Trace, cfg: SimConfig, recorder: Any = None, label: str | None = None,
             shared: SharedPrompts | None = None, prompt_process: bool | None = None) -> SimResult:
    """``shared``: the prompts' tokens and hashes, made once for all runs of ``trace``
    (``SharedPrompts``); without, each request's are made as it arrives: by a second
    process ahead of the run (``PromptFeed``) when ``prompt_process`` is True, or when it
    is None and the trace is large and the box has a second core; else by the run."""
    keep = cfg.keep_events or recorder is not None
    if keep and not cfg.miss_causes:  # a recorded run's events carry the causes
        cfg = replace(cfg, miss_causes=True)
    if shared is not None and shared.trace is not trace:
        raise ValueError("shared prompts of another trace")
    with _no_cycle_collector():  # from the pools' blocks on (a sweep's pods: millions)
        pods = [SimPod(k, cfg.sched, cfg.cache, cfg.cost, keep_events=keep and cfg.recorded(k))
                for k in range(cfg.num_pods)]
        for p in pods:
            if not cfg.miss_causes:  # (then no pod keeps events either)
                p.kv.drop_miss_causes()
                # a cached block's tokens: read only by the book, events and snapshots (a
                # pod takes none): not kept, rather than 16-tuples made for millions of blocks
                p.kv.pool.keep_tokens = False
        for p in pods:
            p.fleet = pods
        rec = _Recording(recorder, cfg, pods, trace, label) if recorder is not None else None
        router = ROUTERS[cfg.router](cfg.num_pods, cfg.cache.block_size, **cfg.router_args)
        times = [RequestTimes(0, 0.0) for _ in trace.requests]
        if cfg.arrivals == "steps":
            _by_steps(trace, pods[0], times, rec)
        else:
            with contextlib.ExitStack() as stack:
                algo = cfg.cache.prefix_caching_hash_algo
                if shared is not None:
                    prompts = zip(shared.prompts(), shared.hashes_for(cfg.cache))
                elif prompt_process or (prompt_process is None and worth_a_process(trace)):
                    prompts = iter(stack.enter_context(PromptFeed(trace, cfg.cache.block_size, algo)))
                else:
                    prompt_hashes = PromptHashes(get_hasher(algo), cfg.cache.block_size)
                    prompts = ((toks, prompt_hashes(tr, toks)) for tr in trace.requests for toks in (tr.tokens(),))
                _by_times(trace, pods, router, times, rec, prompts)
    result = SimResult(cfg, pods, times, trace, list(rec.run_ids.values()) if rec else [])
    if rec is not None:
        rec.finish(result)
    return result


@contextlib.contextmanager
def _no_cycle_collector():
    """Python's cycle collector off for the run, back as it was after. A run makes almost no
    reference cycles, but it holds every queued prompt (a fleet trace's 144M token ids in
    lists) and makes millions of short-lived objects, so the collector kept rescanning
    the queues: a tenth to a quarter of a run's CPU time (bench/RESULTS.md). Whatever
    cycles the run leaves are collected once it is back on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate_recorded(trace: Trace, cfg: SimConfig, db: str | None = None,
                      label: str | None = None) -> SimResult:
    """``simulate`` with each pod recorded as a ``simulated`` run in the run store ``db``
    (default: engine.store's), every row written before it returns."""
    from engine.store.recorder import Recorder

    recorder = Recorder(db)
    try:
        return simulate(trace, cfg, recorder=recorder, label=label)
    finally:
        recorder.close()


def _by_steps(trace: Trace, pod: SimPod, times: list[RequestTimes], rec: _Recording | None) -> None:
    reqs = trace.requests
    ends: dict[int, list[TracedRequest]] = {}
    for tr in reqs:
        if tr.finish_step is not None:
            ends.setdefault(tr.finish_step, []).append(tr)
    i = 0
    while i < len(reqs) or pod.busy():
        step = pod.scheduler.log.step  # the number of the step scheduled next
        if not pod.busy() and reqs[i].arrival_step > step:
            raise ValueError(f"{reqs[i].request_id} arrived before step {reqs[i].arrival_step}, "
                             f"but the engine would be idle from step {step}: not a step-exact trace")
        while i < len(reqs) and (reqs[i].arrival_step or 0) <= step:
            times[i] = RequestTimes(0, pod.clock)
            pod.arrive(reqs[i], i, times[i], reqs[i].tokens())
            i += 1
        for tr in ends.pop(step, ()):
            pod.end_from_outside(tr.request_id, tr.finish)
        pod.start_step(pod.clock)
        pod.finish_step()
        _step_done(pod, rec)


def _by_times(trace: Trace, pods: list[SimPod], router, times: list[RequestTimes],
              rec: _Recording | None, prompts: Iterator[tuple[list[int], tuple[str, ...]]]) -> None:
    """``prompts``: each request's (prompt tokens, prompt hashes), in the trace's order."""
    reqs = trace.requests
    ends: list[tuple[float, int]] = []  # (step end, pod)
    i = 0
    while i < len(reqs) or ends:
        t_arr = reqs[i].arrival_s if i < len(reqs) else math.inf
        if t_arr <= (ends[0][0] if ends else math.inf):
            started = set()
            while i < len(reqs) and reqs[i].arrival_s == t_arr:
                tr = reqs[i]
                tokens, hashes = next(prompts)
                k = router.route(Routed(tr.request_id, tokens, hashes), pods)
                times[i] = RequestTimes(k, t_arr)
                pods[k].arrive(tr, i, times[i], tokens, hashes)
                started.add(k)
                i += 1
            for k in sorted(started):
                p = pods[k]
                if p.in_flight is None and p.busy():
                    heapq.heappush(ends, (p.start_step(t_arr), k))
            continue
        t, k = heapq.heappop(ends)
        p = pods[k]
        p.finish_step()
        _end_outside(p)
        for rid in p.take_finished():
            router.finished(k, rid)
        router.observe(k, *p.take_feed())
        _step_done(p, rec)
        if p.busy():
            heapq.heappush(ends, (p.start_step(t), k))
            for rid in p.take_finished():  # stop strings end at the schedule
                router.finished(k, rid)


def _step_done(p: SimPod, rec: _Recording | None) -> None:
    """The step's events go to the recording; kept with none (``keep_events``), they are
    dropped here, or the pod, busy while events wait, would step for ever."""
    if rec is not None and p.index in rec.run_ids:
        rec.step(p)
    elif p.log.events:
        p.log.drain()


def _end_outside(p: SimPod) -> None:
    """Times: a request the engine ended from outside (a stop string, an abort) ends
    once it sampled what it sampled in the recording."""
    for rid, live in list(p.ending_outside.items()):  # only those: a fleet's queues are long
        tr = live.trace
        if live.request.num_output_tokens >= tr.output_length and live.times.first_scheduled is not None:
            p.end_from_outside(rid, tr.finish)

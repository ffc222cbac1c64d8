"""EngineCore: the scheduler, the model runner, the one fault policy, the CPU thread governor.

vLLM's ``EngineCore`` (``vllm/v1/engine/core.py``): it takes token ids and sampling
params (``EngineCoreRequest``) and answers each step with new token ids, the step's
events and the pool summary (``CoreStep``); it knows no text. The engine
(``engine.llm_engine``) reaches it through a client (``engine.engine_core.client``), in
this process or in a child of its own. Built by ``engine.engine_core.startup.build_engine_core``.

**The fault policy** lives here and only here (docs/architecture.md, "The event protocol
(v2)"): a forward that raises is rerun one request at a time (``_isolate``,
``engine.engine_core.step_isolation``), a fault elsewhere in the step fails the requests
the step held (``_fail_held``); either way the failed user requests are finished in the
scheduler and named in ``CoreStep.fault``. Writer of: the scheduler (and through it the
KV cache manager and pool) and the runner's state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from engine.core import ModelRunnerOutput, Request, RequestStatus, SchedulerOutput
from engine.core.core_step import CoreStep, RequestFailure, StepFault
from engine.engine_core.messages import CoreInfo, EngineCoreRequest
from engine.engine_core.restart import RestartLimits, rebuilt
from engine.engine_core.step_isolation import split_step
from engine.events.folds.pool_snapshot import PoolSnapshot

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core import Scheduler
    from engine.model.loader import LoadedModel
    from engine.model.model_runner import ModelRunner

logger = logging.getLogger(__name__)

_STATS_FIGURES = ("kv_cache_usage", "kv_token_usage", "internal_fragmentation")  # of the pool summary
_STATS_COUNTS = ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate", "prefix_cache_resumed_queries",
                 "prefix_cache_resumed_hits", "num_preemptions", "num_evictions", "cow_copies")  # EventLog.counts


class EngineCore:
    """The core; in the engine's own process it is its own client (the same calls as
    ``engine.engine_core.client.ProcessClient``)."""

    pid = None  # it runs in the engine's process

    def __init__(self, config: EngineConfig, loaded: LoadedModel, scheduler: Scheduler, runner: ModelRunner,
                 kv_bytes_per_block: int, governor: Any = None) -> None:
        self.config = config
        self.loaded = loaded  # the weights (a restart reuses them)
        self.scheduler = scheduler  # its config and cache_config are the derived ones
        self.runner = runner
        self.kv_bytes_per_block = kv_bytes_per_block
        self.governor = governor  # engine.cpu_threads.CoreGovernor (CPU, default thread count)
        self.info = _info(self)
        self.restart_limits = RestartLimits.of(self.info)  # the first build's: a restart keeps them

    # ---- requests -----------------------------------------------------------------

    def add_request(self, r: EngineCoreRequest) -> list[str]:
        """Enter a request; the core ids of its samples after the first (``n_sharing=
        "prefix_cache"``). Raises (and changes nothing) for a prompt that cannot fit,
        a full queue or an id in use."""
        req = Request(r.request_id, r.prompt_token_ids, r.params, arrival_time=r.arrival_time,
                      eos_token_ids=self.loaded.spec.eos_token_ids, seed=r.seed,
                      client=r.client)
        return [s.request_id for s in self.scheduler.add_request(req)[1:]]

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_pending_events(self) -> bool:
        return bool(self.scheduler.log.events)

    # ---- one step -----------------------------------------------------------------

    def step(self, stop_ids: list[str] = (), summary: bool = True) -> CoreStep:
        """schedule → execute → update. ``stop_ids``: requests whose stop string the
        engine matched (finished at this schedule, as vLLM does)."""
        sched, gov = self.scheduler, self.governor
        sched.stop_requests(list(stop_ids))
        if gov is not None:
            gov.tick()  # CPU: torch threads fitted to the free cores
        try:
            out = sched.schedule()
            model_output, fault = self._execute(out)
            if gov is not None:
                gov.stepped()
            done = sched.update_from_output(out, model_output)
        except Exception as exc:
            # A fault outside the forward: the step did not close, its events wait.
            return CoreStep(None, time.time(), [], fault=self._fail_held(exc))
        return dataclasses.replace(done, events=sched.log.drain(),
                                   summary=sched.pool_summary() if summary else None, fault=fault)

    def _execute(self, out: SchedulerOutput) -> tuple[ModelRunnerOutput, StepFault | None]:
        try:
            return self.runner.execute(out), None
        except BaseException as exc:
            self.scheduler.kv.uncache_uncomputed()  # blocks hashed for K/V this forward never wrote
            if out.is_empty or not isinstance(exc, Exception):  # only copies ran: no request to blame
                raise
            return self._isolate(out, exc)

    def _isolate(self, out: SchedulerOutput, exc: Exception) -> tuple[ModelRunnerOutput, StepFault]:
        """Run the failed step's requests one at a time; fail those that raise alone (or
        read K/V a failed one was to write). See ``engine.engine_core.step_isolation``."""
        detail = f"{type(exc).__name__}: {exc}"
        logger.error("engine step %d failed (%s); running its %d request(s) one by one",
                     out.step, detail, len(out.scheduled), exc_info=exc)
        pieces = split_step(out, self.scheduler.kv.block_size)
        sampled: dict = {}
        prompt_logprobs: dict = {}
        failed: dict[str, str] = {}  # user request id -> why
        unsound: set[int] = set()  # blocks a failed piece was to write
        for piece in pieces:
            user = self.scheduler.requests[piece.request_id].parent_id or piece.request_id  # scheduled: entered
            why = None
            if user in failed:
                why = failed[user]  # a sample of a request that failed: it fails whole
            elif len(pieces) == 1:
                why = detail  # alone in its step: it is the one
            elif piece.reads & unsound:
                why = "it read K/V a failed request of its step was to write"
            else:
                try:
                    ran = self.runner.execute(piece.output)
                    sampled.update(ran.sampled)
                    prompt_logprobs.update(ran.prompt_logprobs)
                except Exception as e:
                    why = f"{type(e).__name__}: {e}"
            if why is not None:
                failed.setdefault(user, why)
                unsound |= piece.writes
        if not failed:
            logger.warning("engine step %d: every request ran alone; none failed", out.step)
        return ModelRunnerOutput(sampled, prompt_logprobs), self._fail(out.step, detail, failed)

    def _fail_held(self, exc: Exception) -> StepFault:
        """A step raised outside its forward: fail the requests it held, so the next step
        can run.

        Which requests: the scheduler's ``running`` list after the failed step, that is
        every request the step scheduled (``schedule()`` moves the waiting ones it admits
        there) plus any running one the token budget left out of this step (the failed
        step cannot say which ran; failing one request too many is the safe side). With
        nothing running, the fault came before admission, so the head of ``waiting`` is
        failed. Every failed step removes at least one request, so a poisoned request
        cannot fail step after step. Blocks hashed for K/V the step never wrote lose
        their hash (a prefix hit on them would read garbage). A fault with no request to
        blame cannot be isolated: it is raised."""
        sched = self.scheduler
        held = list(sched.running) or list(sched.waiting)[:1]
        if not held:
            raise exc
        sched.kv.uncache_uncomputed()  # idempotent: a fault after the forward finds nothing to undo
        detail = f"{type(exc).__name__}: {exc}"
        failed = dict.fromkeys((r.parent_id or r.request_id for r in held), detail)  # a fork's samples: one
        logger.error("engine step failed (%s); failing its %d request(s) %s", detail, len(failed),
                     list(failed)[:8], exc_info=exc)
        return self._fail(sched.step, detail, failed)

    def _fail(self, step: int, detail: str, failed: dict[str, str]) -> StepFault:
        """Abort every core request of the failed user requests (a fork's or a fan-out's
        samples too); the step's fault names them (user request id -> why)."""
        self.abort_requests([rid for rid, r in self.scheduler.requests.items() if (r.parent_id or rid) in failed])
        return StepFault(step, detail, [RequestFailure(u, why) for u, why in failed.items()])

    # ---- cache control, figures, restart ------------------------------------------

    def reset_prefix_cache(self) -> int:
        return self.scheduler.kv.reset_prefix_cache()

    def snapshot(self) -> PoolSnapshot:
        return self.scheduler.snapshot()

    def stats(self) -> dict:
        # Counts from the one tracker every event passes (EventLog.counts), so they
        # match the per-step metrics' cumulative counters, events kept or not.
        sched, cache = self.scheduler, self.scheduler.cache_config
        figures = sched.pool_summary().figures()
        return {"num_blocks": cache.num_blocks, "block_size": cache.block_size,
                **{name: figures[name] for name in _STATS_FIGURES},
                **{name: getattr(sched.log.counts, name) for name in _STATS_COUNTS},
                "num_requests_running": len(sched.running), "num_requests_waiting": len(sched.waiting)}

    def restart(self, options: dict[str, Any]) -> CoreStep | None:
        """Become the core ``options`` make of this one's config (within ``restart_limits``),
        on the loaded weights (only the pool and the scheduler change). The new core is
        built first: a refused or failing config raises and leaves this core serving as
        it was. Then every request is aborted and, when that left events, one last step
        publishes them into the old run; that step is returned, and ``info`` is the new
        core's."""
        new = rebuilt(self, options)
        self.abort_requests(list(self.scheduler.requests))
        closing = self.step() if self.has_pending_events() else None
        self.config, self.scheduler, self.runner = new.config, new.scheduler, new.runner
        self.kv_bytes_per_block, self.governor, self.info = new.kv_bytes_per_block, new.governor, new.info
        return closing

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing runs beside the core (a process client stops its child here)."""


def _info(core: EngineCore) -> CoreInfo:
    loaded, cache, sched = core.loaded, core.scheduler.cache_config, core.scheduler.config
    spec = loaded.spec
    d = core.config.to_dict()
    d.update(
        model_name=spec.name, architecture=spec.architecture, device=str(loaded.device),
        dtype=str(loaded.dtype).replace("torch.", ""), attention_backend=core.runner.backend.name,
        block_size=cache.block_size, num_blocks=cache.num_blocks, max_model_len=sched.max_model_len,
        max_num_batched_tokens=sched.max_num_batched_tokens, kv_bytes_per_block=core.kv_bytes_per_block,
        tokenizer_file=_tokenizer_file(loaded.weights_dir),
    )
    return CoreInfo(d, str(loaded.weights_dir), spec.vocab_size)


def _tokenizer_file(weights_dir) -> str | None:
    """The fast tokenizer's JSON, so a torch-free reader (the dashboard) can decode ids."""
    path = weights_dir / "tokenizer.json"
    return str(path.resolve()) if path.is_file() else None

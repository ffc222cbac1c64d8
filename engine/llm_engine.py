"""LLMEngine: one step at a time — schedule → execute → update → process outputs → publish.

Build one with ``engine.startup.build_engine(config)``. The server drives it; ``LLM``
wraps it for offline use. Each step yields RequestOutputs (with streaming deltas) and
one StepRecord (events + metrics) handed to every step listener (the server's
broadcaster, the recorder, and the vLLM-format KV event publisher when
``kv_events_config`` enables one).

Who owns what, per request: the Scheduler (engine.core) its tokens, status and blocks;
the ModelRunner its sampling state (generators included); the OutputProcessor its
text, stop strings, timings and ``RequestOutput``. The engine only passes typed
outputs between them.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.core import (
    CacheConfig, EngineCoreOutputs, KVScopeError, ModelRunnerOutput, Request, RequestStatus,
    SamplingParams, SamplingParamsError, Scheduler, SchedulerConfig, SchedulerOutput,
)
from engine.core.ids import check_request_id
from engine.events.metrics.step_metrics import MetricsConfig, MetricsTracker
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.schema.step import StepRecord
from engine.output_processor import OutputProcessor, ProcessedOutputs
from engine.outputs import RequestOutput
from engine.step_isolation import RequestFailure, StepFault, split_step

if TYPE_CHECKING:
    from engine.engine_parts import EngineParts

logger = logging.getLogger(__name__)

StepListener = Callable[[StepRecord], None]


class LLMEngine:
    """An engine over built parts; use ``engine.startup.build_engine(config)``."""

    def __init__(self, config: EngineConfig, parts: EngineParts, scheduler: Scheduler,
                 kv_events=None) -> None:
        """``kv_events``: a running KVEventsPublisher to take over instead of starting one
        (a server restart keeps its stream, seq and replay buffer across engines)."""
        self.config = config
        self.parts = parts
        self.tokenizer = parts.loaded.tokenizer
        self.spec = parts.loaded.spec
        self.scheduler = scheduler
        self.log = scheduler.log
        self.runner = parts.runner
        self.output_processor = OutputProcessor(self.tokenizer)
        self.metrics = MetricsTracker(MetricsConfig(
            block_size=parts.cache_config.block_size,
            num_blocks=parts.cache_config.num_blocks,
            max_num_batched_tokens=parts.scheduler_config.max_num_batched_tokens))
        self.step_listeners: list[StepListener] = []
        self._rng = random.Random(config.seed)  # seeds of requests that bring none
        self._ids = itertools.count()
        self.last_metrics: dict = {}
        self.last_fault: StepFault | None = None  # the last step's, if its forward raised
        self.core_governor = None  # engine.cpu_threads.CoreGovernor (build_engine, CPU only)
        self.kv_events = None  # KVEventsPublisher when kv_events_config enables one
        self._owns_kv_events = False
        kv_config = config.kv_events_config
        if kv_config is not None and kv_config.active:
            if kv_events is None:
                from engine.kv_events.publisher import KVEventsPublisher

                medium = "GPU" if parts.loaded.device.type == "cuda" else "CPU"
                kv_events = KVEventsPublisher(kv_config, medium)
            self.kv_events, self._owns_kv_events = kv_events, True
            self.step_listeners.append(kv_events.on_step)

    def close(self) -> None:
        """Stop what runs beside the engine (the KV event publisher: queued batches go out)."""
        if self.kv_events is not None and self._owns_kv_events:
            self._owns_kv_events = False
            self.kv_events.close()

    def hand_over_kv_events(self) -> None:
        """A successor engine took this one's KV event publisher (a restart): stop owning it,
        and tell subscribers that the cache the stream described is gone (AllBlocksCleared)."""
        if self.kv_events is not None and self._owns_kv_events:
            self._owns_kv_events = False
            self.kv_events.announce_cleared()

    # ---- facts --------------------------------------------------------------

    @property
    def cache_config(self) -> CacheConfig:
        return self.parts.cache_config

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.parts.scheduler_config

    def describe(self) -> dict:
        """The engine's effective config (derived values filled in), JSON-able."""
        d = self.config.to_dict()
        d.update(
            model_name=self.spec.name, architecture=self.spec.architecture,
            device=str(self.parts.loaded.device), dtype=str(self.parts.loaded.dtype).replace("torch.", ""),
            attention_backend=self.runner.backend.name,
            block_size=self.cache_config.block_size, num_blocks=self.cache_config.num_blocks,
            max_model_len=self.scheduler_config.max_model_len,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            kv_bytes_per_block=self.parts.kv_bytes_per_block,
            tokenizer_file=_tokenizer_file(self.parts.loaded.weights_dir),
        )
        return d

    # ---- requests -----------------------------------------------------------

    def tokenize(self, prompt: str | list[int] | None = None,
                 messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
        if messages is not None:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=True)
            return text, self.tokenizer.encode(text, add_special_tokens=False)
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise KVScopeError(f"token ids out of the vocabulary (0..{self.spec.vocab_size - 1}): {bad[:5]}")
            return None, list(prompt)
        raise KVScopeError("a prompt must be a string or a list of token ids")

    def add_request(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None,
                    request_id: str | None = None, messages: list[dict] | None = None,
                    tokenized: tuple[str | None, list[int]] | None = None, client: str = "") -> str:
        """Tokenize and queue a request; raises KVScopeError subclasses for bad input.
        ``tokenized``: (text, token ids) a front door already made off this thread (the
        server's PromptPrep), used instead of tokenizing ``prompt``/``messages`` here.
        ``client``: who submits it (the unit the "fair" scheduling policy shares between).

        Atomic: everything is checked and built first, and only then is the request
        entered (scheduler, then output processor), so a refusal leaves nothing behind.
        """
        params = params or SamplingParams()
        text, ids = tokenized if tokenized is not None else self.tokenize(prompt, messages)
        # the caller's id follows the one rule ('#' is reserved: fork samples' ids use it)
        rid = check_request_id(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.output_processor.requests or rid in self.scheduler.requests:
            raise KVScopeError(f"request id {rid!r} is already in use")
        vocab = self.spec.vocab_size
        if params.top_k > vocab:
            raise SamplingParamsError(f"top_k must be at most the vocabulary size ({vocab}), got {params.top_k}")
        state = self.output_processor.new_request(rid, text, ids, params, time.time())
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        req = Request(rid, ids, params, arrival_time=state.metrics.arrival_time,
                      eos_token_ids=self.spec.eos_token_ids, seed=seed, client=client)
        # checks length and queue bound before it changes anything; with
        # n_sharing="prefix_cache" it enters each sample as its own request
        for sample in self.scheduler.add_request(req)[1:]:
            state.expect_sample(sample.sample_index, sample.request_id)
        self.output_processor.add_request(state)
        return rid

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request and all its samples; returns its final output."""
        aborted = self.output_processor.abort_request(request_id)
        if aborted is None:
            return None
        output, core_ids = aborted
        for core_id in core_ids:
            self.scheduler.finish_request(core_id, RequestStatus.FINISHED_ABORTED)
        return output

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_pending_events(self) -> bool:
        return bool(self.log.events)

    # ---- one step -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step. If the batched forward raises, the step's requests are run one by one
        and only those whose own run raises are failed (``engine.step_isolation``): their
        final outputs (finish reason "abort") come first in the list, and ``last_fault``
        says what happened. A fault outside the forward is raised."""
        self.last_fault = None
        gov = self.core_governor  # CPU: torch threads fitted to the free cores
        if gov is not None:
            gov.tick()
        scheduler_output = self.scheduler.schedule()
        model_output, aborted = self._execute(scheduler_output)
        if gov is not None:
            gov.stepped()
        core_outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        processed = self._process_outputs(core_outputs)
        self._publish(processed)
        return aborted + processed.request_outputs

    def _execute(self, scheduler_output: SchedulerOutput) -> tuple[ModelRunnerOutput, list[RequestOutput]]:
        try:
            return self.runner.execute(scheduler_output), []
        except Exception as exc:
            self.scheduler.kv.uncache_uncomputed()  # blocks hashed for K/V this forward never wrote
            if scheduler_output.is_empty:  # only copies ran: no request to blame
                raise
            return self._isolate(scheduler_output, exc)
        except BaseException:
            self.scheduler.kv.uncache_uncomputed()
            raise

    def _isolate(self, out: SchedulerOutput, exc: Exception) -> tuple[ModelRunnerOutput, list[RequestOutput]]:
        """Run the failed step's requests one at a time; fail those that raise alone (or
        read K/V a failed one was to write). See ``engine.step_isolation``."""
        detail = f"{type(exc).__name__}: {exc}"
        logger.error("engine step %d failed (%s); running its %d request(s) one by one",
                     out.step, detail, len(out.scheduled), exc_info=exc)
        pieces = split_step(out, self.cache_config.block_size)
        sampled: dict = {}
        failed: dict[str, str] = {}  # user request id -> why
        unsound: set[int] = set()  # blocks a failed piece was to write
        users = [self._user_request_id(piece.request_id) for piece in pieces]
        for piece, user in zip(pieces, users):
            why = None
            if user in failed:
                why = failed[user]  # a sample of a request that failed: it fails whole
            elif len(pieces) == 1:
                why = detail  # alone in its step: it is the one
            elif piece.reads & unsound:
                why = "it read K/V a failed request of its step was to write"
            else:
                try:
                    sampled.update(self.runner.execute(piece.output).sampled)
                except Exception as e:
                    why = f"{type(e).__name__}: {e}"
            if why is not None:
                failed.setdefault(user, why)
                unsound |= piece.writes
        aborted: list[RequestOutput] = []
        for user in failed:
            final = self.abort_request(user)
            if final is not None:
                aborted.append(final)
        for piece, user in zip(pieces, users):  # anything abort_request could not reach (no output state)
            if user in failed and piece.request_id in self.scheduler.requests:
                self.scheduler.finish_request(piece.request_id, RequestStatus.FINISHED_ABORTED)
        self.last_fault = StepFault(out.step, detail, [RequestFailure(u, w) for u, w in failed.items()])
        if not failed:
            logger.warning("engine step %d: every request ran alone; none failed", out.step)
        return ModelRunnerOutput(sampled), aborted

    def _user_request_id(self, core_id: str) -> str:
        req = self.scheduler.requests.get(core_id)
        return req.parent_id if req is not None and req.parent_id is not None else core_id

    def _process_outputs(self, core_outputs: EngineCoreOutputs) -> ProcessedOutputs:
        processed = self.output_processor.process_outputs(core_outputs)
        self.scheduler.stop_requests(processed.reqs_to_stop)  # the next schedule finishes them
        return processed

    def _publish(self, processed: ProcessedOutputs) -> None:
        events = self.log.drain()
        if not self.config.enable_events and not self.step_listeners:
            return
        ts = time.time()
        step = self.scheduler.step  # the step just closed; seq derives from it (one clock)
        self.last_metrics = self.metrics.update(
            events, self.scheduler.pool_summary(), ts, processed.latencies,
            processed.first_tokens, processed.finished_requests)
        record = StepRecord(step - 1, step, ts, events, self.last_metrics)
        for listener in list(self.step_listeners):
            try:
                listener(record)
            except Exception:  # a broken listener must not stop the engine
                logger.exception("step listener %r failed", listener)

    # ---- cache control and figures -----------------------------------------

    def reset_prefix_cache(self) -> int:
        return self.scheduler.kv.reset_prefix_cache()

    def snapshot(self) -> PoolSnapshot:
        return self.scheduler.snapshot()

    def stats(self) -> dict:
        # Counts from the one tracker every event passes (EventLog.counts), so they
        # match the per-step metrics' cumulative counters, events kept or not.
        counts = self.log.counts
        figures = self.scheduler.pool_summary().figures()
        return {
            "num_blocks": self.cache_config.num_blocks,
            "block_size": self.cache_config.block_size,
            "kv_cache_usage": figures["kv_cache_usage"],
            "kv_token_usage": figures["kv_token_usage"],
            "internal_fragmentation": figures["internal_fragmentation"],
            "prefix_cache_queries": counts.prefix_cache_queries,
            "prefix_cache_hits": counts.prefix_cache_hits,
            "prefix_cache_hit_rate": counts.prefix_cache_hit_rate,
            "prefix_cache_resumed_queries": counts.prefix_cache_resumed_queries,
            "prefix_cache_resumed_hits": counts.prefix_cache_resumed_hits,
            "num_preemptions": counts.num_preemptions,
            "num_evictions": counts.num_evictions,
            "cow_copies": counts.cow_copies,
            "num_requests_running": len(self.scheduler.running),
            "num_requests_waiting": len(self.scheduler.waiting),
        }


def _tokenizer_file(weights_dir) -> str | None:
    """The fast tokenizer's JSON, so a torch-free reader (the dashboard) can decode ids."""
    path = weights_dir / "tokenizer.json"
    return str(path.resolve()) if path.is_file() else None

"""LLMEngine: text in, outputs out, one step at a time, over an engine core.

vLLM's split (``vllm/v1/engine/llm_engine.py``; docs/architecture.md, "Two processes: the
engine and its core"): the engine tokenizes, keeps each request's output state (the
OutputProcessor), computes the metrics and hands every step to its listeners; the core
(``engine.engine_core``) takes token ids and answers each step with new token ids,
events and a pool summary, through a client in this process or in a child of its own
(``EngineConfig.engine_core_process``). This module imports no torch either way.

Build one with ``LLMEngine.from_config(config)`` (or ``build_engine`` below for an
in-process core on given weights). ``LLM`` wraps it for offline use.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable

from engine.config import EngineConfig
from engine.core import SamplingParams
from engine.core.ids import check_request_id
from engine.engine_core.client import ProcessClient
from engine.engine_core.core import EngineCore
from engine.core.core_step import CoreStep, StepFault
from engine.engine_core.messages import CoreInfo, EngineCoreRequest
from engine.events.metrics.step_metrics import MetricsConfig, MetricsTracker
from engine.events.folds.pool_snapshot import PoolSnapshot
from engine.events.schema.step import StepRecord
from engine.output_processor import OutputProcessor, ProcessedOutputs
from engine.outputs import RequestOutput
from engine.tokenizer import Tokenizer, tokenize_prompt

logger = logging.getLogger(__name__)

StepListener = Callable[[StepRecord], None]
CoreClient = EngineCore | ProcessClient  # the core itself when it runs here


class LLMEngine:
    """An engine over a running core; see ``from_config``."""

    def __init__(self, config: EngineConfig, core: CoreClient, kv_events=None,
                 tokenizer: Tokenizer | None = None) -> None:
        """``kv_events``: a running KVEventsPublisher to take over instead of starting one
        (a restart keeps its stream, seq and replay buffer); ``tokenizer``: the one of
        the engine this one replaces (same weights)."""
        self.config = config
        self.core = core
        self.info: CoreInfo = core.info
        self.tokenizer = tokenizer or Tokenizer(self.info.weights_dir)
        self.output_processor = OutputProcessor(self.tokenizer)
        d = self.info.describe
        self.metrics = MetricsTracker(MetricsConfig(block_size=d["block_size"], num_blocks=d["num_blocks"],
                                                    max_num_batched_tokens=d["max_num_batched_tokens"]))
        self.step_listeners: list[StepListener] = []
        self._rng = random.Random(config.seed)  # seeds of requests that bring none
        self._ids = itertools.count()
        self._to_stop: list[str] = []  # stop strings matched: the core finishes them next step
        self.last_metrics: dict = {}
        self.last_fault: StepFault | None = None  # the last step's, if part of it failed
        self.kv_events = None  # KVEventsPublisher when kv_events_config enables one (this engine's to close)
        kv_config = config.kv_events_config
        if kv_config is not None and kv_config.active:
            if kv_events is None:
                from engine.kv_events.publisher import KVEventsPublisher

                kv_events = KVEventsPublisher(kv_config)
            self.kv_events = kv_events
            self.step_listeners.append(kv_events.on_step)

    @classmethod
    def from_config(cls, config: EngineConfig, progress: Callable[[str], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> LLMEngine:
        """Start the core ``config`` asks for (``engine_core_process``) and an engine over
        it. ``progress``/``should_stop``: for a core in its own process, its load's log
        lines and a way to give the load up (``engine.engine_core.client``)."""
        if config.engine_core_process:
            return cls(config, ProcessClient(config, progress, should_stop))
        return build_engine(config)  # the core here, and so torch

    def close(self) -> None:
        """Stop what runs beside the engine: the KV event publisher (queued batches go
        out) and the core's process, if it has one."""
        kv, self.kv_events = self.kv_events, None
        if kv is not None:
            kv.close()
        self.core.close()

    # ---- facts --------------------------------------------------------------

    @property
    def engine_core(self) -> EngineCore:
        """The core itself, when it runs in this process (tests and benchmarks look in)."""
        if not isinstance(self.core, EngineCore):
            raise AttributeError("the engine core runs in a process of its own")
        return self.core

    @property
    def model_name(self) -> str:
        return self.info.describe["model_name"]

    @property
    def max_model_len(self) -> int:
        return self.info.describe["max_model_len"]

    def describe(self) -> dict:
        """The engine's effective config (derived values filled in), JSON-able."""
        return dict(self.info.describe)

    # ---- requests -----------------------------------------------------------

    def tokenize(self, prompt: str | list[int] | None = None,
                 messages: list[dict] | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt, a chat or a list of token ids (checked against
        the vocabulary: ``engine.tokenizer.tokenize_prompt``)."""
        return tokenize_prompt(self.tokenizer, self.info.vocab_size, prompt, messages)

    def add_request(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None,
                    request_id: str | None = None, messages: list[dict] | None = None,
                    tokenized: tuple[str | None, list[int]] | None = None, client: str = "") -> str:
        """Tokenize and queue a request; raises KVScopeError subclasses for bad input.
        ``tokenized``: (text, token ids) a front door already made off this thread (the
        server's PromptPrep), used instead of tokenizing ``prompt``/``messages`` here.
        ``client``: who submits it (the unit the "fair" scheduling policy shares between).

        Atomic: everything is checked and built first, and only then is the request
        entered (core, then output processor), so a refusal leaves nothing behind.
        """
        params = params or SamplingParams()
        text, ids = tokenized if tokenized is not None else self.tokenize(prompt, messages)
        # the caller's id follows the one rule ('#' is reserved: fork samples' ids use it)
        rid = check_request_id(request_id) if request_id is not None else f"req-{next(self._ids)}"
        params.check_vocab(self.info.vocab_size)
        state = self.output_processor.new_request(rid, text, ids, params, time.time())  # refuses an id in use
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        # the core checks length, queue bound and id before it changes anything; with
        # n_sharing="prefix_cache" it enters each sample as its own request
        samples = self.core.add_request(EngineCoreRequest(rid, ids, params, state.metrics.arrival_time,
                                                          seed, client))
        for index, core_id in enumerate(samples, start=1):
            state.expect_sample(index, core_id)
        self.output_processor.add_request(state)
        return rid

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request and all its samples; returns its final output."""
        aborted = self.output_processor.abort_request(request_id)
        if aborted is None:
            return None
        output, core_ids = aborted
        self.core.abort_requests(core_ids)
        return output

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def has_pending_events(self) -> bool:
        return self.core.has_pending_events()

    # ---- one step -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One step of the core, its outputs processed and its record published. A step
        part of which failed (``last_fault``: a forward or a step that raised; the core
        finished the requests it failed, ``engine.engine_core.core``) has their final
        outputs (finish reason "abort") first in the list."""
        to_stop, self._to_stop = self._to_stop, []
        out = self.core.step(to_stop, bool(self.config.enable_events or self.step_listeners))
        return self._take(out)

    def _take(self, out: CoreStep) -> list[RequestOutput]:
        self.last_fault = out.fault
        aborted: list[RequestOutput] = []
        for f in out.fault.failures if out.fault is not None else ():
            done = self.output_processor.abort_request(f.request_id)
            if done is not None:
                aborted.append(done[0])
        if out.step is None:  # the step did not close: its events wait for the next one
            return aborted
        processed = self.output_processor.process_outputs(out)
        self._to_stop = processed.reqs_to_stop
        self._publish(out, processed)
        return aborted + processed.request_outputs

    def _publish(self, out: CoreStep, processed: ProcessedOutputs) -> None:
        if out.summary is None:
            return
        ts = time.time()
        self.last_metrics = self.metrics.update(
            out.events, out.summary, ts, processed.latencies, processed.first_tokens,
            processed.finished_requests)
        record = StepRecord(out.step - 1, out.step, ts, out.events, self.last_metrics)
        for listener in list(self.step_listeners):
            try:
                listener(record)
            except Exception:  # a broken listener must not stop the engine
                logger.exception("step listener %r failed", listener)

    # ---- restart ------------------------------------------------------------

    def restart(self, options: dict, deliver: Callable[[RequestOutput], None] = lambda out: None) -> LLMEngine:
        """The engine ``options`` make of this one's config, on the same core and weights
        (``EngineCore.restart``; raises and leaves this engine serving when refused).
        Every request is aborted: ``deliver`` gets each final output, then the old run's
        last events are published to this engine's listeners. The KV event stream goes
        on in the new engine, after an AllBlocksCleared."""
        closing = self.core.restart(options)
        config = dataclasses.replace(self.config, **options)
        for rid in list(self.output_processor.requests):
            deliver(self.output_processor.abort_request(rid)[0])
        if closing is not None:
            self._take(closing)
        kv, self.kv_events = self.kv_events, None  # the new engine's from now on
        if kv is not None:
            kv.announce_cleared()
        return LLMEngine(config, self.core, kv, self.tokenizer)

    # ---- cache control and figures -----------------------------------------

    def reset_prefix_cache(self) -> int:
        return self.core.reset_prefix_cache()

    def snapshot(self) -> PoolSnapshot:
        return self.core.snapshot()

    def stats(self) -> dict:
        return self.core.stats()


def build_engine(cfg: EngineConfig, loaded=None) -> LLMEngine:
    """An engine over a core in this process (on ``loaded`` weights when given: lessons
    and benchmarks build many engines on one model). ``cfg.engine_core_process`` is not
    consulted: this core is here, and so is torch (``engine.engine_core.startup``)."""
    from engine.engine_core.startup import build_engine_core

    return LLMEngine(cfg, build_engine_core(cfg, loaded))

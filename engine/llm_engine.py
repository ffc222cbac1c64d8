"""LLMEngine: one step at a time — schedule → execute → update — then publish.

The server drives it; ``LLM`` wraps it for offline use. Each step yields
RequestOutputs (with streaming deltas) and one StepRecord (events + metrics)
handed to every step listener (the server's broadcaster, the recorder, and the
vLLM-format KV event publisher when ``kv_events_config`` enables one).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable

from engine.config import EngineConfig
from engine.core import (
    CacheConfig, EventLog, KVScopeError, Request, RequestStatus, SamplingParams, Scheduler,
    SchedulerConfig,
)
from engine.core.ids import check_request_id
from engine.events.metrics import LatencyObservations, MetricsConfig, MetricsTracker
from engine.events.pool_snapshot import PoolSnapshot
from engine.events.step import StepRecord
from engine.outputs import RequestOutput
from engine.request_group import RequestGroup
from engine.startup import EngineParts, build_engine_parts

logger = logging.getLogger(__name__)

StepListener = Callable[[StepRecord], None]


class LLMEngine:
    def __init__(self, config: EngineConfig, parts: EngineParts | None = None,
                 kv_events=None) -> None:
        """``kv_events``: a running KVEventsPublisher to take over instead of starting one
        (a server restart keeps its stream, seq and replay buffer across engines)."""
        self.config = config
        self.parts = parts or build_engine_parts(config)
        self.tokenizer = self.parts.loaded.tokenizer
        self.spec = self.parts.loaded.spec
        self.log = EventLog(enabled=config.enable_events)
        self.scheduler = Scheduler(self.parts.scheduler_config, self.parts.cache_config, self.log)
        self.runner = self.parts.runner
        self.metrics = MetricsTracker(MetricsConfig(
            block_size=self.parts.cache_config.block_size,
            num_blocks=self.parts.cache_config.num_blocks,
            max_num_batched_tokens=self.parts.scheduler_config.max_num_batched_tokens))
        self.groups: dict[str, RequestGroup] = {}
        self.step_listeners: list[StepListener] = []
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._seq = 0
        self.last_metrics: dict = {}
        self.kv_events = None  # KVEventsPublisher when kv_events_config enables one
        self._owns_kv_events = False
        kv_config = config.kv_events_config
        if kv_config is not None and kv_config.active:
            if kv_events is None:
                from engine.kv_events.publisher import KVEventsPublisher

                medium = "GPU" if self.parts.loaded.device.type == "cuda" else "CPU"
                kv_events = KVEventsPublisher(kv_config, medium)
            self.kv_events, self._owns_kv_events = kv_events, True
            self.step_listeners.append(kv_events.on_step)

    @classmethod
    def from_args(cls, **kwargs) -> "LLMEngine":
        if "kv_events_config" in kwargs:
            from engine.kv_events.config import KVEventsConfig

            kwargs["kv_events_config"] = KVEventsConfig.coerce(kwargs["kv_events_config"])
        return cls(EngineConfig(**kwargs))

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
                    request_id: str | None = None, messages: list[dict] | None = None) -> str:
        """Tokenize and queue a request; raises KVScopeError subclasses for bad input."""
        params = params or SamplingParams()
        text, ids = self.tokenize(prompt, messages)
        rid = check_request_id(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.groups:
            raise KVScopeError(f"request id {rid!r} is already in use")
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        req = Request(rid, ids, params, arrival_time=time.time(), eos_token_ids=self.spec.eos_token_ids)
        self.scheduler.add_request(req)  # validates length and queue bound
        self.groups[rid] = RequestGroup(rid, text, ids, params, base_seed, req.arrival_time,
                                        self.tokenizer, self.runner.device)
        return rid

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a request and all its samples; returns its final output."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        for core_id in group.unfinished_ids():
            self.scheduler.finish_request(core_id, RequestStatus.FINISHED_ABORTED)
        group.abort(time.time())
        return group.output()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_pending_events(self) -> bool:
        return bool(self.log.events)

    # ---- one step -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        sched = self.scheduler
        out = sched.schedule()
        now = time.time()
        rows = {}
        for s in out.scheduled:
            group = self.groups[_group_id(s.request_id)]
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = now
                group.num_cached_tokens = sched.requests[s.request_id].num_cached_tokens
            if s.num_samples:
                rows[s.request_id] = group.rows_for(s.request_id, s.num_samples)
        try:
            sampled = self.runner.execute(out, rows)
        except BaseException:
            sched.kv.uncache_uncomputed()  # blocks hashed for K/V this forward never wrote
            raise
        now = time.time()
        tokens = {rid: [t.token_id for t in toks] for rid, toks in sampled.items()}
        children, finished = sched.update_from_output(out, tokens)
        ttft, itl, e2e = [], [], []
        touched: dict[str, RequestGroup] = {}
        for rid, toks in sampled.items():
            group = self.groups[_group_id(rid)]
            touched[group.request_id] = group
            k0 = RequestGroup.index_of(rid)
            for k, tok in enumerate(toks):
                core_id = rid if k == 0 else f"{group.request_id}#{k0 + k}"
                stop = group.append(core_id, tok, now, ttft, itl)
                if stop is not None:
                    if core_id in sched.requests:
                        sched.finish_request(core_id, RequestStatus.FINISHED_STOPPED)
                    group.finish(core_id, "stop", stop, now)
        for r in finished:
            group = self.groups[_group_id(r.request_id)]
            touched[group.request_id] = group
            group.finish(r.request_id, r.status.finish_reason,
                         r.stop_token if r.status is RequestStatus.FINISHED_STOPPED else None, now)
        outputs = []
        for gid, group in touched.items():
            outputs.append(group.output())
            if group.finished:
                e2e.append(group.metrics.e2e)
                del self.groups[gid]
        sched.end_step()
        self._publish(now, LatencyObservations(tuple(ttft), tuple(itl), tuple(e2e)))
        return outputs

    def _publish(self, ts: float, lat: LatencyObservations) -> None:
        events = self.log.drain()
        if not self.config.enable_events and not self.step_listeners:
            return
        self.last_metrics = self.metrics.update(events, self.scheduler.pool_summary(), ts, lat)
        record = StepRecord(self._seq, self.scheduler.step, ts, events, self.last_metrics)
        self._seq += 1
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


def _group_id(core_id: str) -> str:
    return core_id.split("#", 1)[0]

"""Runs lessons on the real engine: builds engines, drives workloads, records runs.

``run_lesson`` is what the CLI calls; it returns the lesson's JSON document (see
``lessons.commands``). ``LessonContext`` is what a lesson's ``run(ctx)`` uses:
``ctx.run(variant, workload, **engine_config)`` starts an engine on the loaded
weights (the model loads once per lesson, whatever the sweep), drives the
workload step by step, records every step to the run store under the label
"lesson N: <short> (<variant>)" and returns a ``Trace``.

This module imports torch (through the engine); the lesson modules do not.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from engine.config import EngineConfig
from engine.events.render import render_snapshot
from engine.events.schema.step import StepRecord
from engine.llm_engine import LLMEngine
from engine.llm_engine import build_engine
from engine.store import Recorder

from lessons.base import Lesson
from lessons.scenario import Req, Trace, by_arrival, greedy

log = logging.getLogger("kvscope.lessons")

MAX_STEPS = 5000  # a lesson workload that has not drained by then is a bug, not a lesson


class LessonContext:
    """Engines, recording and prompt helpers for one lesson run."""

    def __init__(self, lesson: Lesson, model: str, *, db: str | None = None, record: bool = True,
                 device: str = "auto", num_threads: int | None = 1) -> None:
        if num_threads:
            import torch

            # Lessons run tiny batches: one thread avoids the sync cost of several.
            torch.set_num_threads(num_threads)
        self.lesson = lesson
        self.model = model
        self.device = device
        self.recorder = Recorder(db) if record else None
        self.traces: list[Trace] = []
        self._loaded = None

    # ---- engines ---------------------------------------------------------------

    def config(self, **overrides: Any) -> EngineConfig:
        return EngineConfig(model=self.model, device=self.device, **overrides)

    def engine(self, **overrides: Any) -> LLMEngine:
        """A fresh engine (empty pool) on the already loaded weights.

        Raises the engine's KVScopeError subclasses (e.g. KVCacheTooSmallError)."""
        cfg = self.config(**overrides)
        eng = build_engine(cfg, loaded=self._loaded)
        self._loaded = eng.engine_core.loaded
        return eng

    def load(self) -> None:
        """Load the weights now (so errors in a lesson's config come after)."""
        if self._loaded is None:
            from engine.model.loader import load_model
            from engine.engine_core.startup import resolve_device

            self._loaded = load_model(self.model, device=resolve_device(self.device))

    @property
    def tokenizer(self):
        self.load()
        return self._loaded.tokenizer

    def model_facts(self) -> dict[str, Any]:
        self.load()
        spec, dtype = self._loaded.spec, self._loaded.dtype
        return {"model_name": spec.name, "num_layers": spec.num_layers,
                "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                "dtype": str(dtype).replace("torch.", ""), "dtype_bytes": dtype.itemsize,
                "vocab_size": spec.vocab_size}

    def kv_bytes_per_block(self, block_size: int) -> int:
        """What one KV block of ``block_size`` tokens costs in this model (K and V, all layers)."""
        self.load()
        return self._loaded.spec.kv_bytes_per_block(block_size, self._loaded.dtype)

    def prompt(self, text: str, n: int) -> list[int]:
        """Exactly ``n`` token ids of ``text`` (repeated if short): lessons need exact
        lengths relative to block boundaries, whatever the tokenizer."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError("prompt text tokenizes to nothing")
        return [ids[i % len(ids)] for i in range(n)]

    def warm_up(self) -> None:
        """One throwaway request, so first-call costs (allocator, kernels) do not land
        in a lesson's timings. Not recorded."""
        eng = self.engine(block_size=16, num_kv_blocks=8, max_model_len=64)
        eng.add_request(self.prompt("warm up", 24), greedy(2))
        while eng.has_unfinished_requests():
            eng.step()

    # ---- one scenario ----------------------------------------------------------

    def run(self, variant: str, workload: Sequence[Req], **engine_config: Any) -> Trace:
        """Drive ``workload`` to completion on a fresh engine; record it; return its Trace."""
        eng = self.engine(**engine_config)
        desc = eng.describe()
        label = f"lesson {self.lesson.number}: {self.lesson.short} ({variant})"
        records: list[StepRecord] = []
        eng.step_listeners.append(records.append)
        run_id = None
        if self.recorder is not None:
            run_id = self.recorder.start_run(desc, model=eng.model_name, label=label)
            eng.step_listeners.append(lambda rec, rid=run_id: self.recorder.record_step(rec, rid))
        outputs: dict[str, dict[str, Any]] = {}
        pending = by_arrival(workload)
        reqs = {r.request_id: r for r in workload}
        t0 = time.perf_counter()
        tick = 0  # driver steps: an engine step, or an idle tick while nothing runs
        while pending or eng.has_unfinished_requests():
            while pending and pending[0].arrive_step <= tick:
                r = pending.pop(0)
                eng.add_request(r.prompt, r.params, request_id=r.request_id)
            tick += 1
            if not eng.has_unfinished_requests():
                continue
            for out in eng.step():
                if out.finished:
                    outputs[out.request_id] = _output_dict(out, reqs[out.request_id].arrive_step)
            if len(records) > MAX_STEPS:
                raise RuntimeError(f"{label}: workload did not drain in {MAX_STEPS} steps")
        wall = time.perf_counter() - t0
        if self.recorder is not None:
            for rid, o in outputs.items():
                self.recorder.record_request(
                    rid, prompt=self.tokenizer.decode(reqs[rid].prompt),
                    params=dataclasses.asdict(reqs[rid].params),
                    outputs=[{"index": i, "text": t, "token_ids": ids, "finish_reason": f}
                             for i, (t, ids, f) in enumerate(zip(o["texts"], o["token_ids"],
                                                                 o["finish_reasons"]))],
                    timings={"ttft_s": o["ttft_s"], "e2e_s": o["e2e_s"]}, run_id=run_id)
            self.recorder.finish(run_id)
        trace = Trace(variant, label, run_id, desc, records, outputs, wall, self.model_facts())
        self.traces.append(trace)
        log.info("%s: %d steps in %.2fs%s", label, len(records), wall,
                 f" (run {run_id})" if run_id else "")
        return trace

    def close(self) -> bool:
        """Flush the recorder; True when every run was stored."""
        return self.recorder.close() if self.recorder is not None else True


def _output_dict(out: Any, arrive_step: int) -> dict[str, Any]:
    m = out.metrics
    return {"token_ids": [list(c.token_ids) for c in out.outputs],
            "texts": [c.text for c in out.outputs],
            "finish_reasons": [c.finish_reason for c in out.outputs],
            "ttft_s": m.ttft if m else None, "e2e_s": m.e2e if m else None,
            "num_cached_tokens": out.num_cached_tokens,
            "num_prompt_tokens": len(out.prompt_token_ids), "arrive_step": arrive_step}


def run_lesson(lesson: Lesson, model: str, *, db: str | None = None, record: bool = True,
               device: str = "auto", num_threads: int | None = 1, width: int = 32) -> dict[str, Any]:
    """Run one lesson end to end; returns its JSON document (shape in lessons.commands)."""
    t0 = time.perf_counter()
    ctx = LessonContext(lesson, model, db=db, record=record, device=device, num_threads=num_threads)
    try:
        result = lesson.run(ctx)
    finally:
        stored = ctx.close()
    lesson.check(result)
    focus_trace, focus_step = result.focus if result.focus else (ctx.traces[-1], None)
    snap = focus_trace.snapshot_at(focus_step)
    doc = lesson.catalog()
    for q in doc["questions"]:
        q["answer"] = result.answers[q["key"]].to_dict()
    doc.update(
        model=model,
        model_name=ctx.model_facts()["model_name"],
        charts=result.charts,
        facts=result.facts,
        runs=[t.ref(focus_step if t is focus_trace else None) for t in ctx.traces],
        pool={"run_id": focus_trace.run_id, "label": focus_trace.label, "step": snap.step,
              "snapshot": snap.to_dict(), "text": render_snapshot(snap, width)},
        recorded=record and stored,
        elapsed_s=round(time.perf_counter() - t0, 2),
    )
    return doc

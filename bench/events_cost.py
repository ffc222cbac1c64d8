"""What events cost: generation throughput with events + streaming + recording on vs off.

"On" is what a served, recorded engine does every step: the core logs its events,
the engine builds the StepRecord and metrics, one listener encodes the ``step``
frame the server would broadcast, and a Recorder queues it for SQLite (its writer
thread serialises and commits in the background, in this process). "Off" is
``enable_events=False`` with no listeners.

The two engines run the same workload in lockstep, one step each in turn (who goes
first alternates), so load from other jobs on a shared machine hits both alike at
step granularity. Each mode's throughput is its output tokens over the wall time
spent inside its own ``step()`` calls. The recorder's writer thread does its part of
the "on" work outside those calls; its CPU time (read per thread from the OS) is
added to the "on" side, as if it ran on the engine's critical path (conservative: on
a second core it partly runs in parallel). The same loss is also computed from CPU
seconds (this thread's inside each ``step()``, plus the writer's), which other jobs'
load does not stretch.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench.run_kvscope import make_engine
from bench.workloads import Workload


def _encode_step(record) -> str:
    try:
        from engine.server.protocol import step_frame
    except ImportError:  # the server is optional here; same JSON shape
        return json.dumps({"type": "step", **record.to_dict()}, separators=(",", ":"))
    return step_frame(record.to_dict())


def _thread_cpu_seconds(native_id: int | None) -> float:
    """User + system CPU seconds of one OS thread of this process (0 if unknown)."""
    if native_id is None:
        return 0.0
    import psutil

    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def run_events_ab(loaded, model: str, workload: Workload, max_num_seqs: int, num_kv_blocks: int,
                  progress_factory=None, **engine_kw) -> dict:
    """Run ``workload`` on an events-off and an events-on engine in lockstep."""
    from engine import SamplingParams
    from engine.store.recorder import Recorder

    engines = {
        "off": make_engine(loaded, model, max_num_seqs, num_kv_blocks, enable_events=False, **engine_kw),
        "on": make_engine(loaded, model, max_num_seqs, num_kv_blocks, enable_events=True, **engine_kw),
    }
    tokens = {"off": 0, "on": 0}
    busy = {"off": 0.0, "on": 0.0}
    cpu = {"off": 0.0, "on": 0.0}  # this thread's CPU seconds inside step()
    steps = {"off": 0, "on": 0}
    bar = progress_factory("events off/on", 2 * workload.num_output_tokens) if progress_factory else None
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp:
        rec = Recorder(str(Path(tmp) / "events.db"))
        on = engines["on"]
        run_id = rec.start_run(on.describe(), model=on.spec.name, label="bench events cost")
        on.step_listeners += [_encode_step, lambda r: rec.record_step(r, run_id)]
        writer = getattr(rec, "_thread", None)
        writer_id = getattr(writer, "native_id", None)
        cpu0 = _thread_cpu_seconds(writer_id)
        for name, eng in engines.items():
            for i, r in enumerate(workload.requests):
                eng.add_request(list(r.prompt_ids), SamplingParams(
                    temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True), request_id=f"r{i}")
        order = ["off", "on"]
        while any(e.has_unfinished_requests() for e in engines.values()):
            for name in order:
                eng = engines[name]
                if not eng.has_unfinished_requests():
                    continue
                t, c = time.perf_counter(), time.thread_time()
                outs = eng.step()
                busy[name] += time.perf_counter() - t
                cpu[name] += time.thread_time() - c
                steps[name] += 1
                new = sum(len(ids) for o in outs for _, ids in o.deltas.values())
                tokens[name] += new
                if bar is not None:
                    bar.update(new)
            order.reverse()
        t = time.perf_counter()
        rec.finish(run_id)
        rec.flush()
        drain = time.perf_counter() - t  # committing what was still queued when the run ended
        writer_cpu = _thread_cpu_seconds(writer_id) - cpu0 if writer_id is not None else None
        ok = rec.close()
        rows = rec.written
    if bar is not None:
        bar.close()
    off = tokens["off"] / busy["off"]
    on_engine = tokens["on"] / busy["on"]
    on_total = tokens["on"] / (busy["on"] + (writer_cpu or 0.0) + drain)
    return {
        "workload": workload.description,
        "method": "lockstep: one step of each engine in turn; recorder writer CPU added to 'on'",
        "steps": steps,
        "output_tokens": tokens,
        "step_seconds": busy,
        "recorder_writer_cpu_s": writer_cpu,
        "recorder_drain_s": drain,
        "throughput_off": off,
        "throughput_on_engine_thread": on_engine,
        "throughput_on": on_total,
        "loss_engine_thread": 1 - on_engine / off,
        "loss": 1 - on_total / off,
        "step_cpu_seconds": cpu,
        "loss_cpu_time": 1 - cpu["off"] / (cpu["on"] + (writer_cpu or 0.0)),
        "rows_recorded": rows,
        "recorder_ok": ok,
    }

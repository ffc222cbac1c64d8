"""What events cost: generation throughput with events + streaming + recording on vs off.

"On" is what a served, recorded engine does every step: the core logs its events,
the engine builds the StepRecord and metrics, one listener encodes the ``step``
frame the server would broadcast, and a Recorder queues it for SQLite (its writer
thread serialises and commits in the background, in this process). "Off" is
``enable_events=False`` with no listeners.

Measuring it: the two modes alternate step by step (off on on off, repeated) in ONE
engine running one workload. Two separate engines, even run in lockstep, differed by
+-6% from run to run on an idle machine (each has its own KV pool, and where that
memory lands changes gather speed), more than the effect being measured; one engine
alternating removes that and spreads other jobs' load evenly over both modes. Both
modes compute identical tokens, so switching does not change the work. Steps pair up
(2i, 2i+1), one of each mode, neighbours in time doing nearly the same work; the
engine-thread loss is 1 - the median over pairs of (off time / on time), a median so
the few prefill-heavy steps at the start do not decide it. The recorder thread's CPU
seconds are then charged to "on" in proportion to its step time, as if the writer ran
on the engine's critical path (conservative: on a second core it partly runs in
parallel). The same loss is also computed from this thread's CPU seconds, which other
jobs' load does not stretch.

Switching modes swaps ``engine.config`` for a copy with ``enable_events`` flipped and
flips ``engine.engine_core.scheduler.log.enabled``: a bench-only manoeuvre (the event stream of a run
measured this way has gaps, which is fine because nothing replays it).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from bench.run_kvscope import make_engine
from bench.workloads import Workload


def _encode_step(record) -> str:
    from engine.protocol import Step, encode

    return encode(Step(record))


def _thread_cpu_seconds(native_id: int | None) -> float:
    """User + system CPU seconds of one OS thread of this process (0 if unknown)."""
    if native_id is None:
        return 0.0
    import psutil

    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def _alternating_pass(loaded, model: str, workload: Workload, max_num_seqs: int, num_kv_blocks: int,
                      bar, **engine_kw) -> dict:
    """One fresh engine runs ``workload``, events off/on alternating per step."""
    from engine.store.recorder import Recorder

    engine = make_engine(loaded, model, max_num_seqs, num_kv_blocks, enable_events=True, **engine_kw)
    configs = {"on": engine.config, "off": dataclasses.replace(engine.config, enable_events=False)}
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp:
        rec = Recorder(str(Path(tmp) / "events.db"))
        run_id = rec.start_run(engine.describe(), model=engine.model_name, label="bench events cost")
        listeners = [_encode_step, lambda r: rec.record_step(r, run_id)]
        writer_id = getattr(getattr(rec, "_thread", None), "native_id", None)
        cpu0 = _thread_cpu_seconds(writer_id)

        def set_mode(mode: str) -> None:
            engine.config = configs[mode]
            engine.engine_core.scheduler.log.enabled = mode == "on"
            engine.step_listeners[:] = listeners if mode == "on" else []

        trace = alternate(engine, workload, set_mode, bar)
        t = time.perf_counter()
        rec.finish(run_id)
        rec.flush()
        drain = time.perf_counter() - t  # committing what was still queued at the end
        writer_cpu = _thread_cpu_seconds(writer_id) - cpu0 if writer_id is not None else None
        ok = rec.close()
    return {"trace": trace, "writer_cpu": writer_cpu, "drain": drain, "ok": ok, "rows": rec.written}


def alternate(engine, workload: Workload, set_mode, bar=None) -> list[tuple[str, float, float, int]]:
    """Queue ``workload``, then step until done with modes off on on off ...; ``set_mode(mode)``
    runs before each step. Returns (mode, wall s, this thread's CPU s, new tokens) per step."""
    from engine import SamplingParams

    for i, r in enumerate(workload.requests):
        engine.add_request(list(r.prompt_ids), SamplingParams(
            temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True), request_id=f"r{i}")
    trace, k = [], 0
    while engine.has_unfinished_requests():
        mode = ("off", "on", "on", "off")[k % 4]
        k += 1
        set_mode(mode)
        t, c = time.perf_counter(), time.thread_time()
        outs = engine.step()
        dt, dc = time.perf_counter() - t, time.thread_time() - c
        new = sum(len(ids) for o in outs for _, ids in o.deltas.values())
        trace.append((mode, dt, dc, new))
        if bar is not None:
            bar.update(new)
    return trace


def _off_on_pairs(trace: list[tuple]) -> list[tuple[tuple, tuple]]:
    """Steps (2i, 2i+1) as (the off step, the on step)."""
    return [(x, y) if x[0] == "off" else (y, x) for x, y in zip(trace[0::2], trace[1::2])]


def _median_ratio(pairs: list[tuple[tuple, tuple]]) -> float:
    """Median over pairs of off wall time / on wall time."""
    return statistics.median([off[1] / on[1] for off, on in pairs] or [1.0])


def run_events_ab(loaded, model: str, workload: Workload, max_num_seqs: int, num_kv_blocks: int,
                  progress_factory=None, repeats: int = 3, **engine_kw) -> dict:
    """Run ``workload`` ``repeats`` times, alternating events off/on per step; the loss.

    The pairs of all passes are pooled: the median over ~50 pairs of one pass still
    moved by +-2% between passes on this shared box, three passes narrow that.
    """
    bar = progress_factory("events off/on", repeats * workload.num_output_tokens) if progress_factory else None
    passes = [_alternating_pass(loaded, model, workload, max_num_seqs, num_kv_blocks, bar, **engine_kw)
              for _ in range(repeats)]
    if bar is not None:
        bar.close()
    pairs, busy, cpu, steps, tokens = [], {"off": 0.0, "on": 0.0}, {"off": 0.0, "on": 0.0}, \
        {"off": 0, "on": 0}, {"off": 0, "on": 0}
    for p in passes:
        trace = p["trace"]
        for mode, dt, dc, new in trace:
            busy[mode] += dt
            cpu[mode] += dc
            steps[mode] += 1
            tokens[mode] += new
        pairs += _off_on_pairs(trace)
    wall_ratio = _median_ratio(pairs)  # off / on
    cpu_ratio = statistics.median([off[2] / on[2] for off, on in pairs if on[2] > 0] or [1.0])
    writer_cpu = sum(p["writer_cpu"] or 0.0 for p in passes)
    writer = writer_cpu + sum(p["drain"] for p in passes)
    per_pass = [1 - _median_ratio(_off_on_pairs(p["trace"])) for p in passes]
    return {
        "workload": workload.description,
        "method": f"{repeats} passes of one fresh engine each, events off/on alternating per step "
                  "(off on on off ...); recorder writer CPU charged to 'on'",
        "repeats": repeats,
        "steps": steps,
        "output_tokens": tokens,
        "step_seconds": busy,
        "step_cpu_seconds": cpu,
        "recorder_writer_cpu_s": writer_cpu if any(p["writer_cpu"] is not None for p in passes) else None,
        "recorder_drain_s": sum(p["drain"] for p in passes),
        "pairs": len(pairs),
        "median_pair_ratio_off_over_on": wall_ratio,
        "loss_engine_thread_per_pass": per_pass,
        "loss_engine_thread": 1 - wall_ratio,
        "loss": 1 - wall_ratio / (1 + writer / busy["on"]),
        "loss_cpu_time": 1 - cpu_ratio / (1 + writer_cpu / cpu["on"]),
        "rows_recorded": sum(p["rows"] for p in passes),
        "recorder_ok": all(p["ok"] for p in passes),
    }

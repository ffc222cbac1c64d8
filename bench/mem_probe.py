"""Run ``kvscope`` with memory probes: where a server's RSS goes over minutes.

    python -m bench.mem_probe OUT.jsonl INTERVAL_S TRACE_FROM_S serve --model ... (kvscope's args)

``bench.soak --mem-probe`` starts the server this way. Every ``INTERVAL_S`` seconds a
thread appends one JSON line to ``OUT.jsonl``: the process's RSS, glibc's arena figures
(``mallinfo2``: in use vs held free), the 20 most numerous object types (gc) with their
change since the first probe, the sizes of the server's own bounded stores (request
book, scheduler, runner states, miss causes, hub, history), and from ``TRACE_FROM_S``
seconds on Python's traced heap (tracemalloc, one frame) with the 20 allocation sites
that grew most since tracing began. Tracing starts late on purpose: from the start it
makes imports and model loading minutes slower on a small box. ``serve`` runs its engine
core in this process here (``--engine-core-in-process``), so the probes see the core's heap too.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import sys
import threading
import time
import tracemalloc


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo() -> dict[str, int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    m = libc.mallinfo2()
    return {"arena_mb": round(m.arena / 2**20, 1), "mmap_mb": round(m.hblkhd / 2**20, 1),
            "in_use_mb": round(m.uordblks / 2**20, 1), "free_held_mb": round(m.fordblks / 2**20, 1)}


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident memory (VmRSS), MB: 0 for one that has none (a zombie);
    raises OSError once it is gone."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _objects() -> tuple[collections.Counter, dict[str, int]]:
    """Object counts by type, and the sizes of what the server keeps (one gc pass; no
    reference to the server's objects is kept)."""
    types: collections.Counter = collections.Counter()
    stores: dict[str, int] = {}
    for o in gc.get_objects():
        name = type(o).__name__
        types[name] += 1
        try:
            if name == "EngineWorker" and o.engine is not None:
                eng = o.engine
                stores.update(book_live=len(o.book.live()), book_used_ids=len(o.book._used),
                              scheduler_requests=len(eng.engine_core.scheduler.requests),
                              output_processor_requests=len(eng.output_processor.requests),
                              runner_states=len(eng.engine_core.runner.requests), kv_hashes=len(eng.engine_core.scheduler.kv.hashes),
                              kv_tables=len(eng.engine_core.scheduler.kv.tables),
                              miss_dropped=len(eng.engine_core.scheduler.kv.misses._dropped),
                              miss_children=len(eng.engine_core.scheduler.kv.misses._children),
                              event_log_pending=len(eng.engine_core.scheduler.log.events))
            elif name == "Hub":
                stores.update(hub_conns=len(o.conns), history_steps=len(o.history._steps))
            elif name == "ApiDesk":
                stores["api_exchanges"] = len(o.exchanges)
        except Exception as exc:  # a probe must never take the server down
            stores[f"{name}_error"] = repr(exc)  # type: ignore[assignment]
    return types, stores


def probe(path: str, interval: float, trace_from: float) -> None:
    """Cheap figures every ``interval``; from ``trace_from`` seconds on, tracemalloc too
    (one frame: allocation sites by line), diffed against its first snapshot."""
    first = None
    base_types: collections.Counter | None = None
    t0 = time.time()
    while True:
        time.sleep(interval)
        t = time.time() - t0
        types, stores = _objects()
        line = {"t": round(t, 1), "rss_mb": round(rss_mb(), 1), "malloc": _mallinfo(),
                "gc_objects": sum(types.values()), "stores": stores}
        if base_types is None:
            base_types = types
        line["types"] = {k: [v, v - base_types.get(k, 0)] for k, v in types.most_common(20)}
        if t >= trace_from and not tracemalloc.is_tracing():
            tracemalloc.start(1)
        elif tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            line["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
            if first is None:
                first = snap
            else:
                line["grew"] = [{"where": str(s.traceback[0]), "mb": round(s.size_diff / 2**20, 3),
                                 "count": s.count_diff}
                                for s in snap.compare_to(first, "lineno")[:20]]
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def main() -> int:
    path, interval, trace_from, argv = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    if argv[:1] == ["serve"] and "--engine-core-in-process" not in argv:
        # the probes read this process's heap, the core's included: keep it here (a
        # probed soak measures the in-process core, not kvscope serve's core process)
        argv = [*argv, "--engine-core-in-process"]
    threading.Thread(target=probe, args=(path, interval, trace_from), name="mem-probe", daemon=True).start()
    from engine.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""Measurement helpers shared by both systems: one run's record, percentiles, RSS, machine.

Times are ``time.perf_counter()`` seconds relative to the run's common start ``t0``:
every request of a workload arrives at t0 (the offline bench), so TTFT is the time
from t0 to the request's first token on either system.

Each run also records the CPU seconds the process used (``time.process_time()``).
On a machine shared with other jobs, wall time stretches with their load while CPU
time mostly does not (summed over the process's threads; under the default
``GOMP_SPINCOUNT=10000`` a thread waiting at a barrier spins ~0.1 ms before it sleeps, so
a little waiting is counted, and under OMP_WAIT_POLICY=PASSIVE none), so tokens per
CPU-second is the load-robust cross-check of throughput.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunRecord:
    """What one system did on one workload; written by that system's runner."""

    system: str
    workload: str
    token_ids: list[list[int]]  # per request, in workload order
    token_times: list[list[float]]  # per request, when each output token was produced
    done_times: list[float]  # per request, when the system handed the result back
    makespan: float  # t0 .. last result
    cpu_s: float = 0.0  # CPU seconds this process used during the run (all threads)
    peak_rss: int = 0  # bytes, sampled during the run
    start_rss: int = 0
    kv: dict[str, Any] = field(default_factory=dict)  # reserved / allocated / used bytes
    extra: dict[str, Any] = field(default_factory=dict)
    load_before: tuple[float, float, float] | None = None
    load_after: tuple[float, float, float] | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(run: RunRecord, rows: list[int] | None = None) -> dict[str, Any]:
    """Headline figures of a run, optionally over a subset of its requests."""
    idx = range(len(run.token_ids)) if rows is None else rows
    ttft = [run.token_times[i][0] for i in idx if run.token_times[i]]
    itl = [b - a for i in idx for a, b in zip(run.token_times[i], run.token_times[i][1:])]
    e2e = [run.done_times[i] for i in idx]
    out_tokens = sum(len(run.token_ids[i]) for i in range(len(run.token_ids)))
    mib = 1 / 2**20
    return {
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / run.makespan if run.makespan > 0 else None,
        "output_tokens_per_cpu_s": out_tokens / run.cpu_s if run.cpu_s > 0 else None,
        "cpu_s": run.cpu_s,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50),
        "e2e_s": run.makespan,
        "e2e_p50_s": percentile(e2e, 50),
        "peak_rss_mib": run.peak_rss * mib,
        "rss_growth_mib": (run.peak_rss - run.start_rss) * mib,
        "kv_reserved_mib": run.kv.get("reserved", 0) * mib,
        "kv_allocated_peak_mib": run.kv.get("allocated_peak", 0) * mib,
        "kv_used_peak_mib": run.kv.get("used_peak", 0) * mib,
        "load_before": run.load_before,
        "load_after": run.load_after,
        **run.extra,
    }


def compare_tokens(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """How many requests got identical greedy tokens; first divergence of the others."""
    diverged = {}
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            diverged[i] = at
    total = sum(len(x) for x in a)
    same_prefix = sum(diverged.get(i, len(x)) for i, x in enumerate(a))
    return {"identical_requests": len(a) - len(diverged), "requests": len(a),
            "tokens_before_divergence": same_prefix, "tokens": total,
            "first_divergence": {str(k): v for k, v in diverged.items()}}


class RssSampler:
    """Samples this process's resident set size every ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        import psutil

        self._proc = psutil.Process()
        self.interval = interval
        self.start = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


# ---- CPU accounting (bench/vllm_compare.py: what the servers and the rest of the box took) ----

_TICK = os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """Every core's busy time since boot (/proc/stat: all but idle and iowait), seconds."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK


def group_cpu_s(pgid: int) -> float:
    """The CPU seconds (user + system) of every live process in group ``pgid``."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.getpgid(int(d.name)) != pgid:
                continue
            stat = (d / "stat").read_text()
        except OSError:
            continue
        parts = stat.rsplit(")", 1)[1].split()
        total += int(parts[11]) + int(parts[12])  # utime, stime (fields 14, 15)
    return total / _TICK


def loadavg() -> tuple[float, float, float] | None:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")  # /proc/cpuinfo names


def cpu_label(machine: dict[str, Any]) -> str:
    """'a 2-core AMD EPYC (avx2)': the machine a result was measured on, for its text."""
    isa = f" ({', '.join(machine['isa'])})" if machine.get("isa") else ""
    return f"a {machine.get('cores', '?')}-core {machine.get('cpu', 'unknown CPU')}{isa}"


def machine_info() -> dict[str, Any]:
    """CPU model, cores, torch/transformers versions, threads and the load right now."""
    import torch

    cpu = platform.processor() or "unknown"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = None
    pressure = None
    try:  # Linux PSI: share of time some runnable task waited for a CPU (avg10/60/300)
        with open("/proc/pressure/cpu") as f:
            first = f.readline().split()
        pressure = {k: float(v) for k, v in (x.split("=") for x in first[1:4])}
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu,
        # what its kernels can use: the same C++ runs AVX-512 or AVX2 code (kernels/*.cpp)
        "isa": [f for f in ISA_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "torch": torch.__version__,
        "transformers": tf_version,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "loadavg": loadavg(),
        "cpu_pressure": pressure,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }

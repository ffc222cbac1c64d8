"""The CPU thread policy: how many torch threads, and how idle OpenMP threads wait.

torch runs its CPU kernels on GNU OpenMP (libgomp). libgomp reads its wait policy
once, when ``import torch`` loads it, so the commands that will run torch call
``set_default_wait_policy()`` first: ``kvscope``'s ``main`` (engine/cli.py), ``LLM()``
(engine/llm.py imports torch only when an engine is built) and ``bench``'s package.
Importing ``engine`` sets nothing. Measured on the 2-core dev box (bench/RESULTS.md,
"Thread policy"; ``python -m bench.threads_ab`` reproduces it):

- On a quiet box, a second thread that spins briefly at each barrier is the fastest:
  2 threads with ``GOMP_SPINCOUNT=10000`` took 0.58-0.76x of 1 thread's step time;
  with ``OMP_WAIT_POLICY=PASSIVE`` (sleep at once: every parallel region then pays a
  futex wake-up) 0.67-1.26x, so PASSIVE wasted much of the second core.
- On a box where another job wants a core, a barrier waits for the thread that lost
  its core: 2 spinning threads took 1.2-1.8x of 1 thread, PASSIVE 1.03-1.14x (about
  1 thread's speed, on 2 threads' worth of wake-ups).
- Governed (below): 0.63-0.80x quiet, 0.95-1.03x busy.

No one setting wins both, so the default is both: ``GOMP_SPINCOUNT=10000`` (set here),
every usable core, and a ``CoreGovernor`` that, between engine steps, fits the torch
thread count to the cores other processes leave free (measured from /proc/stat while
the engine steps): 1 thread while another job holds a core of a 2-core box, back to 2
when it stops. One rule for every use (offline ``LLM.generate``, ``kvscope bench``,
``kvscope serve`` beside the dashboard). ``KVSCOPE_SERVE_THREADS`` gives serving a fixed
count of its own.

Precedence for the thread count: ``EngineConfig.num_threads``, then
``KVSCOPE_NUM_THREADS``, then an exported ``OMP_NUM_THREADS`` (left to torch), then (serve
only) ``KVSCOPE_SERVE_THREADS``, then the default for the use; only the default is
governed (``KVSCOPE_ADAPT_THREADS=0`` keeps it fixed). An exported OpenMP wait setting
always wins over ours. The variables are registered in engine/envs.py.

This module must not import torch at import time.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence

from engine import envs

log = logging.getLogger(__name__)

# None would leave libgomp's own default (spin ~300k iterations, ~3 ms, then sleep);
# 10k iterations is ~0.1 ms: long enough to catch the next parallel region of a step
WAIT_POLICY_ENV: dict[str, str] | None = {envs.GOMP_SPINCOUNT.name: envs.GOMP_SPINCOUNT.default}
_WAIT_VARS = (envs.OMP_WAIT_POLICY, envs.GOMP_SPINCOUNT)


def set_default_wait_policy() -> bool:
    """Put the default OpenMP wait policy into the environment if it can still take
    effect (torch not imported yet) and the user exported none; True if it did.

    Called explicitly, first thing, by what will run torch (never on import)."""
    if WAIT_POLICY_ENV is None or "torch" in sys.modules or any(v.is_set() for v in _WAIT_VARS):
        return False
    for name, value in WAIT_POLICY_ENV.items():
        envs.lookup(name).set(value)
    return True


def usable_cores() -> int:
    return len(_affinity())


def _choose(num_threads: int | None, serving: bool) -> tuple[int | None, str]:
    """The count and where it came from: "config", "env" (KVSCOPE_NUM_THREADS), "omp"
    (an exported OMP_NUM_THREADS, left to torch: None), "serve" (KVSCOPE_SERVE_THREADS)
    or "default" (every usable core)."""
    if num_threads is not None:
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        return num_threads, "config"
    n = envs.NUM_THREADS.get()
    if n is not None:
        return n, "env"
    if envs.OMP_NUM_THREADS.is_set():
        return None, "omp"
    serve = envs.SERVE_THREADS.get() if serving else None
    if serve is not None:
        return min(serve, usable_cores()), "serve"
    return usable_cores(), "default"


def thread_count(num_threads: int | None = None, serving: bool = False) -> int | None:
    """The torch thread count to set, or None to leave torch's (OMP_NUM_THREADS).

    Raises ValueError for a bad ``KVSCOPE_NUM_THREADS`` or ``num_threads``.
    """
    return _choose(num_threads, serving)[0]


def serving_count() -> int | None:
    """The count ``kvscope serve`` fixes for itself (``KVSCOPE_SERVE_THREADS``), or None: serve
    then takes the engine's default, governed like every other use."""
    n, source = _choose(None, True)
    return n if source == "serve" else None


def governed(num_threads: int | None = None) -> bool:
    """Whether the thread count is the default's, for a CoreGovernor to adjust (no
    explicit count anywhere, and ``KVSCOPE_ADAPT_THREADS`` is not 0)."""
    return (_choose(num_threads, False)[1] == "default"
            and envs.ADAPT_THREADS.get())


# ---- the governor -------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def box_busy_s(cpus: Sequence[int]) -> float | None:
    """CPU seconds the ``cpus`` have spent busy since boot, every process's (user, nice,
    system, irq, softirq in /proc/stat; not idle, iowait or steal). None off Linux."""
    want = {f"cpu{c}" for c in cpus}
    try:
        with open("/proc/stat") as f:
            ticks = 0
            for line in f:
                if not line.startswith("cpu"):
                    break
                parts = line.split()
                if parts[0] in want:
                    ticks += sum(int(v) for v in (parts[1], parts[2], parts[3], parts[6], parts[7]))
    except OSError:
        return None
    return ticks / _CLK_TCK


def own_cpu_s() -> float:
    """CPU seconds this process has used, all its threads."""
    t = os.times()
    return t.user + t.system


class CoreGovernor:
    """Fits torch's thread count to the cores other processes leave free.

    ``tick()`` runs before each engine step and ``stepped()`` after it, on the thread that
    runs the steps (torch's count is that thread's). While steps follow one another, it
    measures over windows of ``period_s`` how many cores of ours the rest of the box kept
    busy: the busy time of our CPUs in /proc/stat less this process's own CPU time. Then:
    - down, to ``floor(free + 0.5)`` threads, when that is fewer than now
      (``free`` = cores - others; on 2 cores: another job using over half a core);
    - up, to ``floor(free + 0.3)`` (at most ``max_threads``), when that is more
      (on 2 cores: under 0.3 of a core used elsewhere).
    The gap between the two is the hysteresis. A pause between steps (the engine idle
    longer than ``gap_s``) restarts the window: what others did while we were idle says
    nothing about the cores while we compute. Each engine has its own; the count it
    reads and sets is the calling thread's (OpenMP keeps one per thread).
    """

    def __init__(self, max_threads: int, cpus: Sequence[int] | None = None, period_s: float = 0.25,
                 gap_s: float = 0.1, clock: Callable[[], float] = time.monotonic,
                 box: Callable[[Sequence[int]], float | None] = box_busy_s,
                 own: Callable[[], float] = own_cpu_s, apply: Callable[[int], None] | None = None,
                 current: Callable[[], int] | None = None) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be >= 1")
        self.max_threads = max_threads
        self.cpus = tuple(cpus if cpus is not None else _affinity())
        self.period_s, self.gap_s = period_s, gap_s
        self.clock, self.box, self.own = clock, box, own
        self.apply = apply or _set_torch_threads
        self.current = current or _torch_threads  # the calling thread's count (OpenMP's is per thread)
        self.others = 0.0  # cores busy elsewhere, the last full window
        self.changes = 0
        self._last_end: float | None = None
        self._start: tuple[float, float, float] | None = None  # (clock, box, own)

    def _mark(self, now: float) -> tuple[float, float, float] | None:
        b = self.box(self.cpus)
        return None if b is None else (now, b, self.own())

    def tick(self) -> int | None:
        """Before a step; returns the new thread count when it changed it."""
        now = self.clock()
        last = self._last_end
        if self._start is None or last is None or now - last > self.gap_s:
            self._start = self._mark(now)  # the first step, or the first after a pause
            return None
        t0, b0, o0 = self._start
        if now - t0 < self.period_s:
            return None
        mark = self._mark(now)
        if mark is None:
            return None
        self._start = mark
        _, b1, o1 = mark
        self.others = max(0.0, (b1 - b0) - (o1 - o0)) / (now - t0)
        return self.decide(self.others)

    def stepped(self) -> None:
        """After a step (a pause is measured from here to the next ``tick``)."""
        self._last_end = self.clock()

    def decide(self, others: float) -> int | None:
        free = len(self.cpus) - others
        down = max(1, math.floor(free + 0.5))
        up = min(self.max_threads, max(1, math.floor(free + 0.3)))
        now = self.current()
        new = down if down < now else up if up > now else now
        if new == now:
            return None
        log.info("kvscope: %.2f of %d cores busy in other processes: torch threads %d -> %d",
                 others, len(self.cpus), now, new)
        self.apply(new)
        self.changes += 1
        return new


def _affinity() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux: /proc/stat is not there either
        return tuple(range(os.cpu_count() or 1))


def _set_torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()

"""The CPU thread policy: how many torch threads, and how idle OpenMP threads wait.

Measured on the 2-core dev box (bench/RESULTS.md, "Thread policy"; ``python -m
bench.threads_ab`` reproduces it):

- OpenMP wait policy PASSIVE. torch runs its kernels on GNU OpenMP (libgomp), whose
  default spins ~3 ms at every barrier. When another process wants a core, a spinning
  thread takes it from the one the barrier waits for: with the box loaded, 2 threads
  with libgomp's default were 1.8-10x slower than 1 thread; with PASSIVE (idle threads
  sleep at once) 0.36-1.24x of 1 thread's step time (0.36-0.99x with a busy or bursty
  extra load, the dashboard's case), never the collapse that made the engine fall back
  to 1 thread on small machines. libgomp reads
  ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` once, when ``import torch`` loads it, so
  ``engine/__init__`` sets the default here before anything imports torch.
- Torch threads: every usable core, for every use (offline ``LLM.generate``,
  ``kvscope bench`` and ``kvscope serve`` beside the dashboard): with PASSIVE the
  second thread won under an extra busy or bursty load, was within 0.93-1.24x of one
  thread under other jobs' load, and on a quiet box it is the only way to use the
  second core. ``SERVE_THREADS`` would give serving its own count.

Precedence for the thread count: ``EngineConfig.num_threads``, then
``KVSCOPE_NUM_THREADS``, then an exported ``OMP_NUM_THREADS`` (left to torch), then the
default for the use. An exported OpenMP wait setting always wins over ours.

This module must not import torch at import time.
"""

from __future__ import annotations

import os
import sys

# None would leave libgomp's own default (spin ~300k iterations, ~3 ms, then sleep)
WAIT_POLICY_ENV: dict[str, str] | None = {"OMP_WAIT_POLICY": "PASSIVE"}
SERVE_THREADS: int | None = None  # None: every usable core, as offline
_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def set_default_wait_policy() -> bool:
    """Put the default OpenMP wait policy into ``os.environ`` if it can still take
    effect (torch not imported yet) and the user exported none; True if it did."""
    if WAIT_POLICY_ENV is None or "torch" in sys.modules or any(v in os.environ for v in _WAIT_VARS):
        return False
    os.environ.update(WAIT_POLICY_ENV)
    return True


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_count(num_threads: int | None = None, serving: bool = False) -> int | None:
    """The torch thread count to set, or None to leave torch's (OMP_NUM_THREADS).

    Raises ValueError for a bad ``KVSCOPE_NUM_THREADS`` or ``num_threads``.
    """
    if num_threads is not None:
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
        return num_threads
    env = os.environ.get("KVSCOPE_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"KVSCOPE_NUM_THREADS must be a positive integer, got {env!r}")
        return n
    if "OMP_NUM_THREADS" in os.environ:
        return None
    if serving and SERVE_THREADS is not None:
        return min(SERVE_THREADS, usable_cores())
    return usable_cores()

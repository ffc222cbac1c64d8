"""The CPU thread policy: how many torch threads, and how idle OpenMP threads wait.

Measured on the 2-core dev box (bench/RESULTS.md, "Thread policy"; ``python -m
bench.threads_ab`` reproduces it):

- The OpenMP wait policy, per use. torch runs its kernels on GNU OpenMP (libgomp),
  whose default spins ~3 ms at every barrier. On a quiet box that is the fastest: 2
  threads spinning took 0.62-0.71x of one thread's step time, PASSIVE (idle threads
  sleep at once) 0.70-0.88x, so spinning is 7-22% faster. When another process wants a
  core, a spinning thread takes it from the one the barrier waits for: with the box
  loaded, 2 spinning threads were 1.8-10x slower than 1 thread, PASSIVE 0.36-1.24x
  (0.36-0.99x beside a busy or bursty extra load, the dashboard's case). No setting wins
  both, so the use decides (``wait_policy_for``):

  - ``serve`` (beside the dashboard, which redraws on the same cores): PASSIVE, always;
  - ``offline`` (``LLM``, ``kvscope generate``, ``kvscope bench``, ``python -m bench.*``):
    libgomp's spin when the box is idle as the process starts (the 1-minute load average
    leaves a core for each torch thread: ``load + threads <= cores + 0.5``), PASSIVE
    otherwise.

  libgomp reads ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` once, when ``import torch``
  loads it, so the choice is made before anything imports torch: by ``engine.cli.main``
  for its subcommand, by ``engine`` when ``LLM`` / ``LLMEngine`` are first imported, and
  by ``bench`` on import. Whatever decides first wins; an exported setting always wins.
- Torch threads: every usable core, for every use: with PASSIVE the second thread won
  under an extra busy or bursty load, was within 0.93-1.24x of one thread under other
  jobs' load, and on a quiet box it is the only way to use the second core.
  ``SERVE_THREADS`` would give serving its own count.

Precedence for the thread count: ``EngineConfig.num_threads``, then
``KVSCOPE_NUM_THREADS``, then an exported ``OMP_NUM_THREADS`` (left to torch), then the
default for the use. An exported OpenMP wait setting always wins over ours.

This module must not import torch at import time.
"""

from __future__ import annotations

import os
import sys

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
USES = ("serve", "offline")
SERVE_THREADS: int | None = None  # None: every usable core, as offline
_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# what decided this process's policy (set_default_wait_policy), for reports
decision: str | None = None


def wait_policy_for(use: str, load: float, threads: int, cores: int) -> dict[str, str] | None:
    """The OpenMP environment for ``use`` on a box with 1-minute load average ``load``:
    PASSIVE, or None for libgomp's own spin (see the module docstring)."""
    if use not in USES:
        raise ValueError(f"use must be one of {USES}, got {use!r}")
    if use == "offline" and load + threads <= cores + 0.5:
        return None
    return PASSIVE


def set_default_wait_policy(use: str = "offline") -> bool:
    """Decide this process's OpenMP wait policy for ``use`` while it can still take effect
    (torch not imported yet, nothing exported, not decided before); put PASSIVE into
    ``os.environ`` when that is the choice. True if this call decided."""
    global decision
    if decision is not None or "torch" in sys.modules or any(v in os.environ for v in _WAIT_VARS):
        return False
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("inf")
    try:
        threads = thread_count(serving=use == "serve") or usable_cores()
    except ValueError:  # a bad KVSCOPE_NUM_THREADS: build_engine reports it
        threads = usable_cores()
    env = wait_policy_for(use, load, threads, usable_cores())
    if env:
        os.environ.update(env)
    decision = (f"{use}: {'OMP_WAIT_POLICY=PASSIVE' if env else 'libgomp spin'} "
                f"(1-minute load {load:.2f}, {threads} threads, {usable_cores()} cores)")
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

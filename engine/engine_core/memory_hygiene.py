"""What keeps a long-running server's memory flat (issue 17's soak, bench/soak.py).

Measured on the soak's tiny model (bench/RESULTS.md, "Soak"): the server's RSS rose by
~140 MB when the flooders raised the batch from 2 to ~130 sequences, then crept by a few
MB a minute. Python's own heap hardly moved (tracemalloc); glibc's in-use bytes did,
and with torch's two CPU shape caches turned off they stayed flat. Those caches keep
one compiled oneDNN primitive (and ideep's one computation) per distinct operand
shape, 1024 of each by default: every new batch size adds entries until both are
full. Two bounds, set for the engine thread before its model runs an op:

- ``bound_cpu_shape_caches``: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and
  ``LRU_CACHE_CAPACITY`` default to ``CPU_SHAPE_CACHE_ENTRIES`` (128) here; an
  operator's own values win. Read when the first primitive is made, so setting them
  after ``import torch`` works; a process that already ran oneDNN keeps its sizes.
  The soak's step rate did not change at 128 (the shapes that recur stay cached).
- ``Trimmer``: evicted entries leave free holes in glibc's heap that it keeps
  resident; ``malloc_trim(0)`` every ``TRIM_INTERVAL_S`` hands free pages back
  (3-6 ms a call at the soak's heap). A no-op off glibc.

And one for time: ``freeze_heap``. A loaded server holds ~300-400k objects the cyclic
garbage collector tracks (torch, transformers and the model's modules, the tokenizer,
uvicorn), none of which ever becomes garbage, and every full collection walked them
all: 120-280 ms with the GIL held, every 10-20 s under load, each one an engine gap
that a client sees as a stalled stream (the soak's good clients' p99). ``gc.freeze()``
after the engine is built moves them to the permanent generation, which collections
skip, as vLLM does once its server is up (``vllm/utils/gc_utils.py``,
``freeze_gc_heap``). Everything made afterwards is still collected.

Writer: the engine thread (it calls both).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

from engine import envs

log = logging.getLogger("kvscope.server")

CPU_SHAPE_CACHE_ENTRIES = 128
SHAPE_CACHE_SWITCHES = (envs.ONEDNN_PRIMITIVE_CACHE_CAPACITY, envs.LRU_CACHE_CAPACITY)
TRIM_INTERVAL_S = 30.0


def bound_cpu_shape_caches(entries: int = CPU_SHAPE_CACHE_ENTRIES) -> None:
    for switch in SHAPE_CACHE_SWITCHES:
        switch.set_default(str(entries))


def freeze_heap() -> int:
    """Collect, then freeze everything alive now; the number of objects frozen.

    Called when a run starts, with the previous run's engine already released: what
    an earlier freeze kept is unfrozen first, so a restart's old engine, cycles and
    all, is collected before the new one's heap is frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _glibc_trim() -> Callable[[], object] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class Trimmer:
    """Calls ``trim`` at most once per ``interval`` seconds of ``tick``s."""

    def __init__(self, interval: float = TRIM_INTERVAL_S, trim: Callable[[], object] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.clock = interval, clock
        self.trim = trim if trim is not None else _glibc_trim()
        self._last = clock()
        self.calls = 0

    def tick(self) -> None:
        if self.trim is None:
            return
        now = self.clock()
        if now - self._last >= self.interval:
            self._last = now
            self.calls += 1
            try:
                self.trim()
            except Exception:  # memory hygiene must never stop the engine
                log.exception("kvscope: malloc_trim failed; not trying again")
                self.trim = None

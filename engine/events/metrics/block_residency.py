"""Block residency from events: how long each physical block stays with one tenant.

vLLM samples these behind ``--kv-cache-metrics`` (``vllm/v1/core/kv_cache_metrics.py``,
one block in 100 by default). kvscope's events name every block, so this folds them
exactly, for every block, with vLLM's definitions:

- A block's tenure starts when the pool hands it out: ``block_allocated``, or the
  fresh ``dst`` of a ``cow_copy`` (the only allocation without a ``block_allocated``).
- An access is a new reference to a block already handed out: each block of a
  ``prefix_hit`` (vLLM's ``BlockPool.touch``) and of a ``request_forked`` (the same
  ``touch`` in kvscope's copy-on-write forks). vLLM keeps the last 4 accesses.
- The tenure ends when the pool hands the block out again. As in vLLM's
  ``get_new_blocks``, that ends it whether or not the block still held a hash, and only
  with prefix caching on (vLLM makes no observation with it off).
- Then: lifetime = end − start; idle = end − last access (the start if none); reuse
  gaps = the differences between consecutive recorded accesses (none below two).
- A prefix-cache reset forgets every tenure, as vLLM's collector ``reset()`` does.

Times are the ``ts`` of the step whose events are folded (wall-clock seconds at the
end of the step), so every event of one step shares one time.

Plain Python. Writer: one consumer folds a run's steps in order (the server's
/metrics registry); ``reset`` starts a new run (a new pool).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.events.schema import types as event_types

ACCESS_HISTORY = 4  # vLLM's BlockMetricsState.access_history maxlen


@dataclass(frozen=True, slots=True)
class BlockTenure:
    """One ended tenure (vLLM's ``KVCacheEvictionEvent``, plus the block id)."""

    block: int
    lifetime_s: float
    idle_s: float
    reuse_gaps_s: tuple[float, ...]


@dataclass(slots=True)
class _Tenancy:
    start: float
    last_access: float
    accesses: deque[float]


class BlockResidency:
    """Folds steps into ended tenures; holds at most one open tenure per block."""

    def __init__(self, enable_prefix_caching: bool = True) -> None:
        self.enable_prefix_caching = enable_prefix_caching
        self._open: dict[int, _Tenancy] = {}

    def reset(self, enable_prefix_caching: bool | None = None) -> None:
        """A new run (a new pool): forget every open tenure."""
        if enable_prefix_caching is not None:
            self.enable_prefix_caching = enable_prefix_caching
        self._open.clear()

    @property
    def num_open(self) -> int:
        return len(self._open)

    def observe(self, events: Iterable[event_types.Event], ts: float) -> list[BlockTenure]:
        """Fold one step's events (in order) at its time ``ts``; the tenures they ended."""
        ended: list[BlockTenure] = []
        if not self.enable_prefix_caching:
            return ended
        for e in events:
            t = type(e)
            if t is event_types.BlockAllocated:
                self._hand_out(e.block, ts, ended)
            elif t is event_types.CowCopy:
                self._hand_out(e.dst, ts, ended)
            elif t is event_types.PrefixHit or t is event_types.RequestForked:
                for b in e.blocks:
                    self._access(b, ts)
            elif t is event_types.PrefixCacheReset:
                self._open.clear()
        return ended

    def _hand_out(self, block: int, ts: float, ended: list[BlockTenure]) -> None:
        old = self._open.get(block)
        if old is not None:
            acc = old.accesses
            gaps = tuple(acc[i] - acc[i - 1] for i in range(1, len(acc)))
            ended.append(BlockTenure(block, ts - old.start, ts - old.last_access, gaps))
        self._open[block] = _Tenancy(ts, ts, deque(maxlen=ACCESS_HISTORY))

    def _access(self, block: int, ts: float) -> None:
        ten = self._open.get(block)
        if ten is None:  # handed out before a reset: vLLM tracks it no more either
            return
        ten.last_access = ts
        ten.accesses.append(ts)

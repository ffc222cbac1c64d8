"""kvscope's own figures (``kvscope_*``): what vLLM does not export, with the same labels.

Gauges show the latest step; counters add each step's ``_step`` deltas (see
``engine.events.metrics.step_metrics``) or count events, so they stay monotonic across restarts.
The hub's own figures (websocket connections, drops, errors) are ``ServerMetrics``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter, Gauge

from engine.events.metrics.step_metrics import MISS_CAUSES
from engine.events.schema.types import BlockEvicted, Event, EvictionReason
from engine.server.metrics.series import Series

EVICTION_REASONS = tuple(r.value for r in EvictionReason)

# (step metric, gauge name, help)
_GAUGES = (
    ("kv_token_usage", "kvscope_kv_token_usage", "Filled token slots / all token slots."),
    ("num_filled_slots", "kvscope_kv_filled_token_slots", "Token slots holding a computed token."),
    ("internal_fragmentation", "kvscope_internal_fragmentation",
     "1 - filled slots / slots of referenced blocks (shared blocks once)."),
    ("num_used_blocks", "kvscope_num_used_blocks", "Blocks with ref_count > 0."),
    ("num_free_blocks", "kvscope_num_free_blocks", "Blocks with ref_count 0."),
    ("num_shared_blocks", "kvscope_num_shared_blocks", "Blocks with ref_count > 1."),
    ("num_cached_free_blocks", "kvscope_num_cached_free_blocks", "Free blocks that still hold a hash."),
    ("num_requests_preempted", "kvscope_num_requests_preempted", "Requests preempted and waiting to resume."),
    ("prefix_cache_hit_rate", "kvscope_prefix_cache_hit_rate",
     "Prefix-cache hit tokens / query tokens, this run."),
    ("budget_used", "kvscope_budget_used", "Batched tokens / max_num_batched_tokens, last step."),
    ("output_throughput_tps", "kvscope_output_throughput_tokens_per_second", "Output tokens per second."),
)
# (step delta, counter name without _total, help)
_COUNTERS = (
    ("cow_copies_step", "kvscope_cow_copies", "Copy-on-write block copies."),
    ("prefix_cache_resets_step", "kvscope_prefix_cache_resets", "Prefix-cache resets."),
    ("num_requests_finished_step", "kvscope_requests_finished", "Requests finished."),
    ("num_prefill_tokens", "kvscope_prefill_tokens", "Prefill tokens computed."),
    ("num_decode_tokens", "kvscope_decode_tokens", "Decode tokens computed."),
)


class KVScopeFamilies:
    """The kvscope-named families of one registry. Writer: ``ServerMetrics`` (loop thread)."""

    def __init__(self, series: Series) -> None:
        s = series
        self._gauges = {key: s.one(Gauge, name, doc) for key, name, doc in _GAUGES}
        self._counters = {key: s.one(Counter, name, doc) for key, name, doc in _COUNTERS}
        self.misses = s.by(Counter, "kvscope_prefix_cache_misses", "Prefix-cache miss tokens by cause.",
                           "cause", MISS_CAUSES)
        self.evictions = s.by(Counter, "kvscope_evictions",
                              "Cached blocks that lost their hash, by reason: reuse (LRU, the block "
                              "was handed out again), reset (prefix-cache reset), rollback (a failed "
                              "forward forgot the hashes it gave).", "reason", EVICTION_REASONS)
        self.steps = s.one(Counter, "kvscope_steps", "Engine steps published.")
        self.num_blocks = s.one(Gauge, "kvscope_num_blocks", "Blocks in the KV pool.")
        self.block_size = s.one(Gauge, "kvscope_block_size", "Token slots per block.")
    def watch_config(self, config: Callable[[], dict[str, Any]]) -> None:
        self.num_blocks.set_function(lambda: config().get("num_blocks") or 0)
        self.block_size.set_function(lambda: config().get("block_size") or 0)

    def observe(self, m: dict[str, Any], events: Iterable[Event]) -> None:
        """Fold one step's metrics dict and events."""
        self.steps.inc()
        for key, gauge in self._gauges.items():
            v = m.get(key)
            if isinstance(v, (int, float)):
                gauge.set(v)
        for key, counter in self._counters.items():
            counter.inc(m.get(key) or 0)
        for cause in MISS_CAUSES:
            self.misses[cause].inc(m.get(f"prefix_cache_miss_{cause}_step") or 0)
        for e in events:
            if type(e) is BlockEvicted:
                self.evictions[str(e.reason)].inc()

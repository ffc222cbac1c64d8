"""Token against block occupancy, and the bound an attached run allows (issue 31 item 6).

Two figures answer "how full is the KV cache?", both fractions of the whole pool:
- block usage, ``kv_cache_usage`` (vLLM's ``vllm:kv_cache_usage_perc``): referenced
  blocks / all blocks. A block holding one token counts as much as a full one;
- token usage, ``kv_token_usage``: filled token slots of referenced blocks / all slots
  (``PoolSummary.figures``; a shared block counted once, at its fullest).
vLLM PR #57336 measured them apart: 17-token prompts on ``block_size`` 16 read 66.7%
block usage while 36.5% of the slots held a token; with 400-token prompts the two agree.

kvscope's own engine knows both exactly: every block's fill follows from the tables and
each request's computed tokens (``engine.events.metrics.pool_summary``), live and in a
fold of the events alike.

An attached engine tells less. Its ``/metrics`` give block usage (and, from
``cache_config_info``, the pool's size), and its KV events announce the hashes of the
*full* blocks it stored and removed: the stored block copies it still holds, each one
``block_size`` tokens. Which of them are referenced, and how full the partial blocks
are, it never says. What then holds (``TokenUsageBound``), with ``N`` blocks, ``U``
referenced, ``S`` stored copies held:
- at most ``N - U`` of the stored blocks are free, so at least ``max(0, S - (N - U))``
  referenced blocks are full: token usage >= that / ``N``;
- no referenced block holds more than ``block_size`` tokens: token usage <= ``U / N``,
  the block usage itself.
The lower bound is tight when every free block still holds a hash and the partial blocks
are nearly empty, the #57336 workload's shape; it falls to 0 when the free blocks are
mostly hashless. It holds only for a complete stream: a gap, or a stream joined late,
leaves ``S`` unknown (``HashCacheSnapshot.incomplete``).

For a vLLM v1 pod: ``N`` is ``num_gpu_blocks - 1`` (``cache_config_info``; the null block
is never handed out and ``get_usage`` in vllm/v1/core/block_pool.py leaves it out),
``U = round(kv_cache_usage_perc * N)``, and ``S`` counts copies (vLLM re-stores a hash it
recomputes into a second block: ``CachedBlockView.copies``) on the GPU medium. One
full-attention KV cache group is assumed; a hybrid model's groups fill differently.

Writer: none (values).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenUsageBound:
    """Where token usage (fraction of all slots) lies when only block usage and the
    stored full blocks are known (module docstring)."""

    low: float
    high: float

    @classmethod
    def of(cls, num_blocks: int, num_used_blocks: int, num_stored_blocks: int) -> TokenUsageBound:
        """``num_stored_blocks``: stored block copies held (stored, not yet removed)."""
        for name, v in (("num_blocks", num_blocks), ("num_used_blocks", num_used_blocks),
                        ("num_stored_blocks", num_stored_blocks)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if num_blocks < 1:
            raise ValueError("num_blocks must be at least 1")
        if num_used_blocks > num_blocks or num_stored_blocks > num_blocks:
            raise ValueError(f"{num_used_blocks} used and {num_stored_blocks} stored blocks "
                             f"do not fit a pool of {num_blocks}")
        free = num_blocks - num_used_blocks
        return cls(low=max(0, num_stored_blocks - free) / num_blocks,
                   high=num_used_blocks / num_blocks)

    @classmethod
    def of_vllm(cls, num_gpu_blocks: int, kv_cache_usage: float, num_stored_blocks: int) -> TokenUsageBound:
        """The bound for a vLLM v1 pod from its ``/metrics`` (``cache_config_info``'s
        ``num_gpu_blocks``, ``kv_cache_usage_perc``) and its stored GPU copies: ``N`` leaves the
        null block out, ``U = round(usage x N)`` (module docstring); ValueError as ``of``."""
        n = int(num_gpu_blocks) - 1
        return cls.of(n, min(n, round(kv_cache_usage * n)), min(n, num_stored_blocks))

    def holds(self, token_usage: float) -> bool:
        return self.low <= token_usage <= self.high

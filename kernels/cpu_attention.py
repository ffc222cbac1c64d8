"""Paged decode attention for the CPU in C++ (kernels/cpu_attention.cpp): the float32
CPU path's decodes read their context straight from the paged cache, with no gathered
copy and no SDPA call per layer.

Used by `kernels.torch_paged` for the decodes that do not share a cached prefix (those
take the cascade path) when the extension builds here; otherwise that module's batched
gather + SDPA runs, with the same results to float32 rounding. ``KVSCOPE_CPU_DECODE_KERNEL=0``
turns it off (for A/B runs: ``python -m bench.step_ab decode_kernel``), and with it
``write_kv``, the same file's copy of a step's new K/V rows into the cache.
"""

from __future__ import annotations

import torch

from kernels.cpu_build import DefaultPathKernels

KERNELS = DefaultPathKernels("cpu_attention.cpp", "KVSCOPE_CPU_DECODE_KERNEL",
                             "CPU decode attention falls back to torch (gather + SDPA)")
extension = KERNELS.module  # the compiled kernel; raises KernelUnavailableError when it cannot be built
decode_kernel_enabled = KERNELS.enabled  # on unless KVSCOPE_CPU_DECODE_KERNEL=0, if it builds


def _rows_ok(t: torch.Tensor) -> bool:
    """A float32 CPU tensor whose last two dims (heads, head_dim) are contiguous."""
    if t.dtype != torch.float32 or not t.is_cpu:  # is_cpu: t.device builds an object
        return False
    strides = t.stride()
    return strides[-1] == 1 and strides[-2] == t.shape[-1]


def _caches_ok(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Contiguous caches, both float32 or both bfloat16 (kv_cache_dtype="bfloat16")."""
    dtype = key_cache.dtype
    return ((dtype == torch.float32 or dtype == torch.bfloat16) and value_cache.dtype == dtype
            and key_cache.is_contiguous() and value_cache.is_contiguous())


def can_run(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """The kernel's inputs: float32 CPU queries with heads contiguous in each row, caches
    of float32 or bfloat16."""
    return _rows_ok(query) and _caches_ok(key_cache, value_cache)


def can_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """``write_kv``'s inputs: float32 CPU rows with contiguous heads, contiguous caches;
    and the kernels on (the same switch as the decode kernel)."""
    return _rows_ok(key) and _rows_ok(value) and _caches_ok(key_cache, value_cache) and decode_kernel_enabled()


def write_kv(key, value, key_cache, value_cache, slots) -> None:
    """Copy key / value [T, kv_heads, head_dim] into cache slots ``slots`` (int64 [T], all
    valid); bitwise ``reshape_and_cache_ref`` (a bfloat16 cache's rows rounded as torch's
    ``.to``), in one call instead of two ``index_copy_``."""
    extension().write_kv(key, value, key_cache, value_cache, slots)


def can_run_prefill(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """``paged_prefill_attention``'s inputs: `can_run`'s, float32 caches (a bf16 cache's
    prefill attends in bf16 through SDPA), and a head_dim the build has a vector path for."""
    return (can_run(query, key_cache, value_cache) and key_cache.dtype == torch.float32
            and extension().prefill_takes(query.shape[-1]))


def paged_prefill_attention(query, key_cache, value_cache, q_starts, q_lens, block_tables, seq_lens, scale,
                            out) -> None:
    """Write causal attention of P prefill chunks over their paged contexts into their rows
    of ``out`` [T, heads, head_dim]: chunk c's rows q_starts[c] .. + q_lens[c] (int64 / int32
    [P]) are the last q_lens[c] positions of a context of seq_lens[c] tokens (int32 [P]), in
    blocks block_tables[c] (int32 [P, max_blocks]); float32 caches."""
    extension().paged_prefill_attention(query, key_cache, value_cache, q_starts, q_lens, block_tables, seq_lens,
                                        float(scale), out)


def paged_decode_attention(query, key_cache, value_cache, rows, block_tables, seq_lens, scale, out) -> None:
    """Write attention of query rows ``rows`` [D] (one token per sequence) over their
    paged contexts into the same rows of ``out`` [T, heads, head_dim].

    block_tables int32 [D, max_blocks] and seq_lens int32 [D] are the decodes' own rows
    (context length including the new token); the caches are [num_blocks, block_size,
    kv_heads, head_dim], float32 and contiguous."""
    extension().paged_decode_attention(query, key_cache, value_cache, rows, block_tables, seq_lens,
                                       float(scale), out)

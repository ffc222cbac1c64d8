"""Paged-attention kernels: Triton versions and their torch reference twins.

Import each kernel from its module (``from kernels.triton_attention import
paged_attention``); this package re-exports only the torch reference twins. The
Triton modules stay out of this file on purpose: importing triton fixes compiled-vs-
interpreted mode (TRITON_INTERPRET) for the whole process, and CPU-only users of
the twins should not pay for (or be bound by) that import.
"""

from kernels.reference import (
    copy_blocks_ref,
    paged_attention_ref,
    reshape_and_cache_ref,
)

__all__ = ["copy_blocks_ref", "paged_attention_ref", "reshape_and_cache_ref"]

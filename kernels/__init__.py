"""Paged-attention kernels: Triton versions and their torch reference twins.

The Triton names are imported lazily: importing triton fixes compiled-vs-interpreted
mode (TRITON_INTERPRET) for the whole process, and CPU-only users of the reference
twins should not pay for (or be bound by) that import.
"""

from kernels.reference import (
    copy_blocks_ref,
    paged_attention_ref,
    reshape_and_cache_ref,
)

_TRITON = {
    "copy_blocks": "kernels.triton_copy",
    "paged_attention": "kernels.triton_attention",
    "reshape_and_cache": "kernels.triton_cache",
}

__all__ = ["copy_blocks_ref", "paged_attention_ref", "reshape_and_cache_ref", *_TRITON]


def __getattr__(name: str):
    if name in _TRITON:
        import importlib

        return getattr(importlib.import_module(_TRITON[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")

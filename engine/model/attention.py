"""Attention metadata for one flattened varlen batch, and the attention backends.

A backend owns the three paged-cache operations the forward pass needs: write the
step's new K/V into their slots, attend through block tables, and copy whole blocks
(copy-on-write). The torch backend runs `kernels.reference`; the Triton backend runs
`kernels.{reshape_and_cache, paged_attention, copy_blocks}` (same signatures).
"""

from __future__ import annotations

import abc
import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable, Literal

import torch

logger = logging.getLogger(__name__)

BackendName = Literal["auto", "torch", "triton"]


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where the step's T query tokens of S sequences live in the paged cache.

    Written by the model runner, once per step; the forward pass only reads it.
    Semantics follow `kernels/reference.py`: sequence s owns query rows
    query_start_loc[s]:query_start_loc[s+1], and its context (cached prefix plus this
    step's tokens) is seq_lens[s] long.
    """

    slot_mapping: torch.Tensor  # int64 [T]; block_id * block_size + offset, < 0 = skip
    block_tables: torch.Tensor  # int32 [S, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [S]; context length INCLUDING new tokens
    query_start_loc: torch.Tensor  # int32 [S + 1]; cumulative query lengths
    max_query_len: int
    max_seq_len: int

    def __post_init__(self) -> None:
        checks = [
            (self.slot_mapping, torch.int64, 1, "slot_mapping"),
            (self.block_tables, torch.int32, 2, "block_tables"),
            (self.seq_lens, torch.int32, 1, "seq_lens"),
            (self.query_start_loc, torch.int32, 1, "query_start_loc"),
        ]
        for t, dtype, ndim, name in checks:
            if t.dtype != dtype or t.dim() != ndim:
                raise ValueError(
                    f"AttentionMetadata.{name} must be {dtype} with {ndim} dims, "
                    f"got {t.dtype} with shape {tuple(t.shape)}"
                )
        num_seqs = self.seq_lens.shape[0]
        if self.block_tables.shape[0] != num_seqs:
            raise ValueError(
                f"block_tables has {self.block_tables.shape[0]} rows for {num_seqs} sequences"
            )
        if self.query_start_loc.shape[0] != num_seqs + 1:
            raise ValueError(
                f"query_start_loc needs {num_seqs + 1} entries, got {self.query_start_loc.shape[0]}"
            )
        if self.max_query_len < 0 or self.max_seq_len < 0:
            raise ValueError("max_query_len and max_seq_len must be >= 0")

    @property
    def num_tokens(self) -> int:
        """T, the number of query tokens in the batch."""
        return self.slot_mapping.shape[0]

    @property
    def num_seqs(self) -> int:
        """S, the number of sequences in the batch."""
        return self.seq_lens.shape[0]


class AttentionBackend(abc.ABC):
    """Paged-cache operations used by the forward pass. Stateless apart from kernels."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Short name shown in logs and the dashboard ("torch" or "triton")."""

    @abc.abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,  # [T, kv_heads, head_dim]
        value: torch.Tensor,  # [T, kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # int64 [T]
    ) -> None:
        """Store the step's new K/V rows into their cache slots, in place."""

    @abc.abstractmethod
    def attend(
        self,
        query: torch.Tensor,  # [T, heads, head_dim]
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Causal attention through block tables; returns [T, heads, head_dim]."""

    @abc.abstractmethod
    def copy_blocks(
        self,
        key_caches: list[torch.Tensor],
        value_caches: list[torch.Tensor],
        block_mapping: torch.Tensor,  # int64 [P, 2] of (src, dst)
    ) -> None:
        """Copy whole blocks src -> dst in every layer (copy-on-write)."""


class TorchAttentionBackend(AttentionBackend):
    """Pure-torch paged attention; the CPU default.

    ``impl="fast"`` (default) runs `kernels.torch_paged`: decodes batched into one
    gather + two bmm, prefill chunks through SDPA. ``impl="reference"`` runs the simple
    per-sequence twin in `kernels.reference` (same results within fp32 rounding).
    The fast path memoises its per-step plan on the metadata object it was built
    from (every layer of a forward pass sees the same one), so one backend instance
    serves one runner at a time.
    """

    def __init__(self, impl: Literal["fast", "reference"] = "fast") -> None:
        if impl not in ("fast", "reference"):
            raise ValueError(f"unknown torch attention impl {impl!r}; use fast or reference")
        self.impl = impl
        self._plan_meta: AttentionMetadata | None = None  # the meta the plan was built from
        self._plan = None
        self._slots: torch.Tensor | None = None  # the slot_mapping _slots_valid describes
        self._slots_valid = False

    @property
    def name(self) -> str:
        return "torch"

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        if self.impl == "reference":
            from kernels.reference import reshape_and_cache_ref

            reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
            return
        from kernels.torch_paged import reshape_and_cache_fast

        if slot_mapping is not self._slots:
            self._slots, self._slots_valid = slot_mapping, bool((slot_mapping >= 0).all())
        reshape_and_cache_fast(key, value, key_cache, value_cache, slot_mapping,
                               all_valid=self._slots_valid)

    def attend(self, query, key_cache, value_cache, meta, scale) -> torch.Tensor:
        if self.impl == "reference":
            from kernels.reference import paged_attention_ref

            return paged_attention_ref(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                meta.query_start_loc, scale,
            )
        from kernels.torch_paged import build_plan, paged_attention_fast

        if meta is not self._plan_meta:
            self._plan = build_plan(meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                    key_cache.shape[1])
            self._plan_meta = meta
        return paged_attention_fast(
            query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
            meta.query_start_loc, scale, plan=self._plan,
        )

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        from kernels.reference import copy_blocks_ref

        copy_blocks_ref(key_caches, value_caches, block_mapping)


class TritonAttentionBackend(AttentionBackend):
    """Triton paged kernels; on CPU they run in Triton's interpreter (slow, exact)."""

    def __init__(self) -> None:
        self._kernels: dict[str, Callable] = {}

    @property
    def name(self) -> str:
        return "triton"

    def _kernel(self, name: str) -> Callable:
        # Imported on first use: the kernels package (and triton) may be absent or
        # still being written, and importing triton fixes TRITON_INTERPRET for good.
        if name not in self._kernels:
            import kernels

            try:
                self._kernels[name] = getattr(kernels, name)
            except (AttributeError, ImportError) as exc:
                raise RuntimeError(
                    f"kernels.{name} is not available ({exc}); use the torch attention backend"
                ) from exc
        return self._kernels[name]

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        self._kernel("reshape_and_cache")(key, value, key_cache, value_cache, slot_mapping)

    def attend(self, query, key_cache, value_cache, meta, scale) -> torch.Tensor:
        # The max lengths are host-side hints: with them the kernel never syncs.
        return self._kernel("paged_attention")(
            query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
            meta.query_start_loc, scale,
            max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
        )

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        self._kernel("copy_blocks")(key_caches, value_caches, block_mapping)


def select_backend(name: BackendName, device: torch.device | str) -> AttentionBackend:
    """Pick the attention backend: "auto" is triton on CUDA and torch elsewhere.

    "triton" on a non-CUDA device runs Triton's interpreter, which must be enabled
    (TRITON_INTERPRET=1) before triton is first imported.
    """
    device = torch.device(device)
    if name not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown attention backend {name!r}; use auto, torch or triton")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type == "cuda":
        return TritonAttentionBackend()
    if os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise RuntimeError(
                "the triton backend on CPU needs Triton's interpreter, but triton was "
                "imported without TRITON_INTERPRET=1; set TRITON_INTERPRET=1 in the "
                "environment before starting Python, or use the torch backend"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    logger.warning(
        "attention backend 'triton' on %s runs Triton's interpreter "
        "(TRITON_INTERPRET=1): exact but much slower than the torch backend",
        device.type,
    )
    return TritonAttentionBackend()

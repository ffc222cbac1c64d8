"""Attention metadata for one flattened varlen batch, and the attention backends.

A backend owns the three paged-cache operations the forward pass needs: write the
step's new K/V into their slots, attend through block tables, and copy whole blocks
(copy-on-write). The torch backend runs `kernels.torch_paged` (or the simple twins in
`kernels.reference`); the Triton backend runs `kernels.triton_cache`,
`kernels.triton_attention` and `kernels.triton_copy` (same signatures).

Once per step the runner asks the backend to ``plan`` the step's metadata: whatever
the backend works out from it (the torch path's decode groups and prefill chunks) is
done there, once, and carried in ``AttentionMetadata.plan`` to every layer.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from engine import envs
from kernels.cpu_attention import decode_kernel_enabled
from kernels.reference import copy_blocks_ref, paged_attention_ref, reshape_and_cache_ref
from kernels.torch_paged import PagedPlan, build_plan, paged_attention_fast, reshape_and_cache_fast

logger = logging.getLogger(__name__)

BackendName = Literal["auto", "torch", "triton"]


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where the step's T query tokens of S sequences live in the paged cache.

    Written by the model runner, once per step; the forward pass only reads it.
    Semantics follow `kernels/reference.py`: sequence s owns query rows
    query_start_loc[s]:query_start_loc[s+1], and its context (cached prefix plus this
    step's tokens) is seq_lens[s] long. The ``*_cpu`` twins are the host lists the
    runner built the tensors from (None when built by hand), so a backend can plan
    without reading the device back. ``plan`` is the backend's own per-step plan,
    set by ``AttentionBackend.plan``.
    """

    slot_mapping: torch.Tensor  # int64 [T]; block_id * block_size + offset, < 0 = skip
    block_tables: torch.Tensor  # int32 [S, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [S]; context length INCLUDING new tokens
    query_start_loc: torch.Tensor  # int32 [S + 1]; cumulative query lengths
    max_query_len: int
    max_seq_len: int
    seq_lens_cpu: tuple[int, ...] | None = None
    query_start_loc_cpu: tuple[int, ...] | None = None
    all_slots_valid: bool | None = None  # True: no slot < 0 (None: unknown)
    plan: PagedPlan | None = None  # the torch backend's; the Triton kernels need none

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

    def plan(self, meta: AttentionMetadata, block_size: int) -> AttentionMetadata:
        """The step's metadata with this backend's plan filled in (once per step)."""
        return meta

    @abc.abstractmethod
    def write_kv(
        self,
        key: torch.Tensor,  # [T, kv_heads, head_dim]
        value: torch.Tensor,  # [T, kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
        value_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        """Store the step's new K/V rows into their cache slots (``meta.slot_mapping``)."""

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

    ``impl="fast"`` (default) runs `kernels.torch_paged`: on the CPU decodes through
    the C++ kernel of `kernels.cpu_attention` (where it builds; else batched into one
    gather + SDPA), a shared prefix through cascade attention, prefill chunks through
    SDPA. ``impl="reference"`` runs the simple per-sequence twin in `kernels.reference`
    (same results within fp32 rounding).
    The fast path's plan is built by ``plan`` once per step; metadata built by hand
    without one (tests) is planned on each call.
    """

    def __init__(self, impl: Literal["fast", "reference"] = "fast", decode_kernel: bool | None = None) -> None:
        if impl not in ("fast", "reference"):
            raise ValueError(f"unknown torch attention impl {impl!r}; use fast or reference")
        self.impl = impl
        # None: the C++ decode kernel for CPU steps when it builds here (kernels/cpu_attention.py),
        # decided at the first CPU plan so that CUDA use never builds it
        self.decode_kernel = decode_kernel

    @property
    def name(self) -> str:
        return "torch"

    def plan(self, meta: AttentionMetadata, block_size: int) -> AttentionMetadata:
        if self.impl == "reference":
            return meta
        seq_lens = meta.seq_lens_cpu if meta.seq_lens_cpu is not None else meta.seq_lens
        starts = meta.query_start_loc_cpu if meta.query_start_loc_cpu is not None else meta.query_start_loc
        kernel = False
        if meta.block_tables.device.type == "cpu":
            if self.decode_kernel is None:
                self.decode_kernel = decode_kernel_enabled()
            kernel = self.decode_kernel
        return dataclasses.replace(meta, plan=build_plan(meta.block_tables, seq_lens, starts, block_size, kernel))

    def write_kv(self, key, value, key_cache, value_cache, meta) -> None:
        if self.impl == "reference":
            reshape_and_cache_ref(key, value, key_cache, value_cache, meta.slot_mapping)
            return
        reshape_and_cache_fast(key, value, key_cache, value_cache, meta.slot_mapping,
                               all_valid=meta.all_slots_valid)

    def attend(self, query, key_cache, value_cache, meta, scale) -> torch.Tensor:
        if self.impl == "reference":
            return paged_attention_ref(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
                meta.query_start_loc, scale,
            )
        return paged_attention_fast(  # plan None (metadata built by hand): planned per call
            query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
            meta.query_start_loc, scale, plan=meta.plan,
        )

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        copy_blocks_ref(key_caches, value_caches, block_mapping)


@dataclass(frozen=True, slots=True)
class _TritonKernels:
    reshape_and_cache: Callable
    paged_attention: Callable
    copy_blocks: Callable


class TritonAttentionBackend(AttentionBackend):
    """Triton paged kernels; on CPU they run in Triton's interpreter (slow, exact).

    The kernel modules are imported on first use, not at construction: importing
    triton fixes TRITON_INTERPRET for the whole process, and ``select_backend`` must
    be able to set it first (or refuse).
    """

    def __init__(self) -> None:
        self._ops: _TritonKernels | None = None

    @property
    def name(self) -> str:
        return "triton"

    @property
    def kernels(self) -> _TritonKernels:
        if self._ops is None:
            try:
                from kernels.triton_attention import paged_attention
                from kernels.triton_cache import reshape_and_cache
                from kernels.triton_copy import copy_blocks
            except ImportError as exc:
                raise RuntimeError(
                    f"the Triton kernels (kernels.triton_cache.reshape_and_cache, "
                    f"kernels.triton_attention.paged_attention, kernels.triton_copy.copy_blocks) "
                    f"are not available ({exc}); use the torch attention backend") from exc
            self._ops = _TritonKernels(reshape_and_cache, paged_attention, copy_blocks)
        return self._ops

    def write_kv(self, key, value, key_cache, value_cache, meta) -> None:
        self.kernels.reshape_and_cache(key, value, key_cache, value_cache, meta.slot_mapping)

    def attend(self, query, key_cache, value_cache, meta, scale) -> torch.Tensor:
        # The max lengths are host-side hints: with them the kernel never syncs.
        return self.kernels.paged_attention(
            query, key_cache, value_cache, meta.block_tables, meta.seq_lens,
            meta.query_start_loc, scale,
            max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
        )

    def copy_blocks(self, key_caches, value_caches, block_mapping) -> None:
        self.kernels.copy_blocks(key_caches, value_caches, block_mapping)


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
    if name == "torch":  # on the CPU the decode kernel is built (or found cached) now, not mid-step
        return TorchAttentionBackend(decode_kernel=decode_kernel_enabled() if device.type == "cpu" else False)
    if device.type == "cuda":
        return TritonAttentionBackend()
    if not envs.TRITON_INTERPRET.get():
        if "triton" in sys.modules:
            raise RuntimeError(
                "the triton backend on CPU needs Triton's interpreter, but triton was "
                "imported without TRITON_INTERPRET=1; set TRITON_INTERPRET=1 in the "
                "environment before starting Python, or use the torch backend"
            )
        envs.TRITON_INTERPRET.set("1")
    logger.warning(
        "attention backend 'triton' on %s runs Triton's interpreter "
        "(TRITON_INTERPRET=1): exact but much slower than the torch backend",
        device.type,
    )
    return TritonAttentionBackend()

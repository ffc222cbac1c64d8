"""ModelSpec: the few facts about a loaded model that the engine plans with."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.kv_cache import kv_cache_bytes_per_block


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Sizes the engine needs for KV budgeting, stopping and limits. Written once by
    the loader."""

    name: str
    architecture: str  # HF model_type: llama, qwen2, mistral, opt
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    max_position_embeddings: int  # longest context the model handles (window-clamped)

    def __post_init__(self) -> None:
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
                      "vocab_size", "max_position_embeddings"):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelSpec.{field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if any(not 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ValueError(f"eos ids {self.eos_token_ids} outside vocab {self.vocab_size}")

    def kv_bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes one KV block costs across all layers (K and V)."""
        return kv_cache_bytes_per_block(
            self.num_layers, block_size, self.num_kv_heads, self.head_dim, dtype
        )

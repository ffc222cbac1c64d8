"""Model side of the engine: loading, paged forward passes, attention backends, sampling."""

from engine.model.attention import (
    AttentionBackend,
    AttentionMetadata,
    TorchAttentionBackend,
    TritonAttentionBackend,
    select_backend,
)
from engine.model.base import CausalLM, MissingWeightsError
from engine.model.kv_cache import allocate_kv_caches, kv_cache_bytes_per_block, num_blocks_for_budget
from engine.model.loader import LoadedModel, load_model
from engine.model.registry import SUPPORTED_ARCHITECTURES, UnsupportedArchitectureError
from engine.model.sampler import RowSampling, SamplerOutput, make_generator, sample
from engine.model.spec import ModelSpec

__all__ = [
    "AttentionBackend", "AttentionMetadata", "CausalLM", "LoadedModel", "MissingWeightsError",
    "ModelSpec", "RowSampling", "SUPPORTED_ARCHITECTURES", "SamplerOutput",
    "TorchAttentionBackend", "TritonAttentionBackend", "UnsupportedArchitectureError",
    "allocate_kv_caches", "kv_cache_bytes_per_block", "load_model", "make_generator",
    "num_blocks_for_budget", "sample", "select_backend",
]

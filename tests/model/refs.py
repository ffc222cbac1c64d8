"""Our loaded tiny models paired with transformers' reference, built once per session."""

from __future__ import annotations

import functools

import torch

from engine.model import LoadedModel, load_model
from tests.tiny_models import tiny_model_dir


@functools.lru_cache(maxsize=None)
def tiny_pair(kind: str) -> tuple[LoadedModel, torch.nn.Module]:
    """(our model, transformers' model) loaded from the same tiny checkpoint, fp32."""
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(kind)
    ours = load_model(str(path))
    ref = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return ours, ref


def reference_logits(ref: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """transformers' logits [len, vocab] for one whole sequence, no cache."""
    with torch.inference_mode():
        return ref(torch.tensor([token_ids]), use_cache=False).logits[0].float()


def our_prefill_logits(loaded: LoadedModel, token_ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Our logits [len, vocab] for one whole sequence prefilled in one step, with a
    simple contiguous block table (blocks 0, 1, 2, ...)."""
    from engine.model import AttentionMetadata, TorchAttentionBackend, allocate_kv_caches

    spec, n = loaded.spec, len(token_ids)
    num_blocks = (n + block_size - 1) // block_size
    caches = allocate_kv_caches(spec.num_layers, num_blocks, block_size, spec.num_kv_heads,
                                spec.head_dim, loaded.dtype, loaded.device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None, :],
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n,
        max_seq_len=n,
    )
    ids = torch.tensor(token_ids, dtype=torch.int64)
    hidden = loaded.model(ids, torch.arange(n), meta, caches, TorchAttentionBackend())
    return loaded.model.compute_logits(hidden).float()

"""What every model family provides: the paged forward pass, logits and weight loading."""

from __future__ import annotations

import abc
from typing import Callable

import torch
from torch import nn

from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.kv_cache import KVCache

# Looks up an HF checkpoint tensor by its HF name; None if the checkpoint lacks it.
TensorGetter = Callable[[str], "torch.Tensor | None"]


def empty_param(*shape: int) -> nn.Parameter:
    """A weight slot filled later by `load_weights`; torch.empty skips costly init."""
    return nn.Parameter(torch.empty(shape), requires_grad=False)


class MissingWeightsError(ValueError):
    """The checkpoint lacks weights the model needs."""


class CausalLM(nn.Module, abc.ABC):
    """A decoder-only LM that attends through a paged KV cache.

    Subclasses build weight slots with `empty_param` and list in `weight_sources()`
    which HF tensors fill each slot (several are concatenated along dim 0, which is
    how fused QKV and gate/up weights are made).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @abc.abstractmethod
    def weight_sources(self) -> dict[str, list[str]]:
        """Our parameter name -> HF tensor names concatenated (dim 0) to fill it."""

    @abc.abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,  # int64 [T]
        positions: torch.Tensor,  # int64 [T]
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] for a flattened varlen batch."""

    @abc.abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [R, vocab] for selected hidden rows [R, hidden]."""

    def reduce_precision(self, fmt: str) -> None:
        """Store every linear weight as ``fmt`` ("int8" or "bfloat16"; CPU, float32
        compute). Families whose lm_head is not a Linear extend this."""
        from engine.model.layers import Linear

        for module in self.modules():
            if isinstance(module, Linear):
                module.reduce_precision(fmt)

    def load_weights(self, get: TensorGetter, dtype: torch.dtype) -> None:
        """Fill every parameter from HF tensors, cast to `dtype`; raise on gaps."""
        params = dict(self.named_parameters())
        sources = self.weight_sources()
        unmapped = sorted(set(params) - set(sources))
        if unmapped:  # a programming error in the subclass, not in the checkpoint
            raise AssertionError(f"parameters without a weight source: {unmapped}")
        missing: list[str] = []
        for name, hf_names in sources.items():
            parts = [get(n) for n in hf_names]
            gaps = [n for n, t in zip(hf_names, parts) if t is None]
            if gaps:
                missing.extend(gaps)
                continue
            tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            param = params[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"weight {hf_names} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(param.shape)} for {name}"
                )
            param.data = tensor.to(dtype).contiguous()
        if missing:
            shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise MissingWeightsError(
                f"checkpoint is missing {len(missing)} weight(s) for "
                f"{type(self).__name__}: {shown}"
            )

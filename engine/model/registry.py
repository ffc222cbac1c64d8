"""Which HF architectures we run, and the model class for each."""

from __future__ import annotations

from typing import Any

from engine.model.base import CausalLM
from engine.model.llama import LlamaForCausalLM
from engine.model.opt import OPTForCausalLM

# HF `config.model_type` -> our implementation.
MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "opt": OPTForCausalLM,
}
SUPPORTED_ARCHITECTURES = tuple(sorted(MODEL_CLASSES))


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture has no forward pass here."""


def model_class(config: Any) -> type[CausalLM]:
    """Our model class for an HF config; clear error for anything else."""
    model_type = getattr(config, "model_type", None)
    cls = MODEL_CLASSES.get(model_type)
    if cls is None:
        archs = getattr(config, "architectures", None) or []
        raise UnsupportedArchitectureError(
            f"unsupported architecture {model_type!r} {archs}; "
            f"kvscope supports: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return cls

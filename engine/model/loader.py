"""load_model: a local HF directory, a .gguf file, or "smollm2-135m" -> a ready model.

The weights always come from an HF-style directory: a GGUF is first dequantized into
a cached one (see gguf_cache). Our model classes are built with empty weight slots
and filled straight from the checkpoint, fusing QKV and gate/up on the way.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from engine.core.config import QUANTIZATIONS
from engine.model.base import CausalLM
from engine.model.checkpoint import open_checkpoint
from engine.model.gguf_cache import DEFAULT_MODEL, default_gguf_path, ensure_dequantized
from engine.model.registry import model_class
from engine.model.spec import ModelSpec
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with everything the engine needs alongside it."""

    model: CausalLM
    hf_config: Any
    spec: ModelSpec
    dtype: torch.dtype
    device: torch.device
    weights_dir: Path  # the HF directory the weights were read from
    weight_format: str = "float32"  # how linear weights are stored: float32 / bfloat16 / int8 (CPU)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The directory's tokenizer, read on first use (lessons and benchmarks build
        prompts with it; the core never does: it takes token ids)."""
        return Tokenizer(self.weights_dir)


def resolve_model_dir(model: str, cache_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """(HF directory holding the weights, display name) for a model argument."""
    if model.lower() == DEFAULT_MODEL:
        return ensure_dequantized(default_gguf_path(), cache_dir), DEFAULT_MODEL
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ensure_dequantized(path, cache_dir), path.stem
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is a directory without config.json")
        return path, path.name
    raise FileNotFoundError(
        f"model {model!r} not found: pass a local HF model directory, a .gguf file, or "
        f"{DEFAULT_MODEL!r} (nothing is downloaded from the hub)"
    )


def resolve_weight_format(dtype: str | torch.dtype, quantization: str | None, device: torch.device) -> str:
    """How the linear weights are stored: "float32" (the default), or on the CPU
    "bfloat16" (``dtype="bfloat16"``) or "int8" (``quantization="int8"``), both computed
    in float32, or "w8a8" (int8 weights, inputs rounded to int8: kernels/cpu_linear.py).
    On CUDA ``dtype`` is the compute dtype as usual."""
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"unknown quantization {quantization!r}; use None or one of {QUANTIZATIONS}")
    if quantization is not None:
        if device.type != "cpu":
            raise ValueError(f"quantization={quantization!r} is a CPU feature (int8 linears)")
        return quantization
    if device.type == "cpu" and dtype in ("bfloat16", "bf16", torch.bfloat16):
        return "bfloat16"
    return "float32"


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, config: Any) -> torch.dtype:
    """"auto": float32 on CPU; on CUDA the config's half dtype, else bfloat16.

    Half precision compute on CPU is slow and poorly supported by torch's CPU kernels,
    so it falls back to float32 with a warning (bfloat16 never gets here on the CPU: it
    means bf16 weight storage, see resolve_weight_format).
    """
    if isinstance(dtype, str) and dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {sorted(_DTYPES)}")
        dtype = _DTYPES[dtype]
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(declared, str):
            declared = _DTYPES.get(declared)
        return declared if declared in _HALF else torch.bfloat16
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, *_HALF):
        raise ValueError(f"unsupported dtype {dtype!r}; use float32, float16 or bfloat16")
    if dtype in _HALF and device.type == "cpu":
        logging.warning("dtype %s is not supported on CPU; using float32", dtype)
        return torch.float32
    return dtype


def _eos_ids(config: Any, weights_dir: Path) -> tuple[int, ...]:
    # Union of config, generation config and tokenizer eos, in that order: chat models
    # often end turns with a token only one of them names. The tokenizer's is read from
    # its files (engine.tokenizer: no tokenizer is loaded for the core).
    found: list[int] = []

    def add(value: Any) -> None:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in found:
                found.append(v)

    add(getattr(config, "eos_token_id", None))
    if (weights_dir / "generation_config.json").is_file():
        from transformers import GenerationConfig

        add(GenerationConfig.from_pretrained(str(weights_dir)).eos_token_id)
    add(Tokenizer(weights_dir).eos_token_id)
    return tuple(found)


def _max_positions(config: Any) -> int:
    # Our attention has no sliding window, so a windowed model is exact only up to
    # its window; clamp the usable context there rather than silently diverge.
    limit = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    windowed = window is not None and (
        config.model_type == "mistral"
        or (config.model_type == "qwen2" and getattr(config, "use_sliding_window", False))
    )
    if windowed and window < limit:
        logger.warning(
            "%s uses a %d-token sliding window, which kvscope does not implement; "
            "limiting context to %d tokens", config.model_type, window, window,
        )
        return int(window)
    return limit


def build_spec(name: str, config: Any, model: CausalLM, weights_dir: Path) -> ModelSpec:
    """The ModelSpec for a loaded model."""
    heads = config.num_attention_heads
    return ModelSpec(
        name=name,
        architecture=config.model_type,
        num_layers=model.num_layers,
        num_heads=heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        eos_token_ids=_eos_ids(config, weights_dir),
        bos_token_id=getattr(config, "bos_token_id", None),
        max_position_embeddings=_max_positions(config),
    )


def load_model(
    model: str = DEFAULT_MODEL,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    cache_dir: str | os.PathLike | None = None,
    quantization: str | None = None,
) -> LoadedModel:
    """Load weights and config; the model is ready for paged forwards.

    ``quantization="int8"`` or ``dtype="bfloat16"`` on the CPU store the linear
    weights in that format and compute in float32 (kernels/cpu_linear.py)."""
    from transformers import AutoConfig

    device = torch.device(device)
    weight_format = resolve_weight_format(dtype, quantization, device)
    weights_dir, name = resolve_model_dir(model, cache_dir)
    config = AutoConfig.from_pretrained(str(weights_dir), trust_remote_code=trust_remote_code)
    cls = model_class(config)  # raises for unsupported architectures before any work
    torch_dtype = resolve_dtype("float32" if weight_format != "float32" else dtype, device, config)
    logger.info("loading %s (%s) from %s as %s on %s%s", name, config.model_type, weights_dir,
                torch_dtype, device, "" if weight_format == "float32" else f", {weight_format} weights")
    net = cls(config)
    with open_checkpoint(weights_dir) as get:
        net.load_weights(get, torch_dtype)
    net = net.to(device).eval()
    if weight_format != "float32":
        net.reduce_precision(weight_format)
    spec = build_spec(name, config, net, weights_dir)
    return LoadedModel(net, config, spec, torch_dtype, device, weights_dir, weight_format)

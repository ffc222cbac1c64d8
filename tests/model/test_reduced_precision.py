"""A tiny model with int8 or bfloat16 CPU weights loads, generates, and stays close to
its float32 twin; the default stays float32."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.core import ConfigError
from engine.model.loader import load_model, resolve_weight_format
from kernels import cpu_linear
from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="module", autouse=True)
def _kernels_built(cpu_compiler):
    """Every test here loads reduced-precision weights, which need the kernels."""
    cpu_linear.extension()


def _prompt_logits(loaded, ids):
    """Last-position logits of a whole prompt, through the paged forward."""
    from engine.model import TorchAttentionBackend, allocate_kv_caches
    from engine.model.attention import AttentionMetadata

    spec = loaded.spec
    caches = allocate_kv_caches(spec.num_layers, 4, 16, spec.num_kv_heads, spec.head_dim, torch.float32, "cpu")
    n = len(ids)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, dtype=torch.int64),
        block_tables=torch.arange(4, dtype=torch.int32)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        max_query_len=n, max_seq_len=n)
    hidden = loaded.model(torch.tensor(ids), torch.arange(n), meta, caches, TorchAttentionBackend())
    return loaded.model.compute_logits(hidden[-1:])[0]


@pytest.mark.parametrize("kind", ["llama", "llama3-tied", "qwen2"])
@pytest.mark.parametrize("fmt", ["int8", "bfloat16"])
def test_loads_with_reduced_weights_close_to_float32(kind, fmt):
    path = str(tiny_model_dir(kind))
    ref = load_model(path)
    kw = {"quantization": "int8"} if fmt == "int8" else {"dtype": "bfloat16"}
    red = load_model(path, **kw)
    assert ref.weight_format == "float32" and red.weight_format == fmt
    assert red.dtype == torch.float32  # activations and KV stay float32
    assert red.model.layers[0].qkv_proj.weight.numel() == 0  # float32 copy dropped
    assert red.model.logits_reduced is not None
    ids = list(range(5, 45))
    a, b = _prompt_logits(ref, ids), _prompt_logits(red, ids)
    # random tiny weights: an int8 step is 1/127 of its group's max |w|, a bf16 step 1/256
    # of the weight itself; measured worst over the kinds: 3.5% (int8), 1.6% (bf16) of the
    # largest logit
    bound = 0.06 if fmt == "int8" else 0.025
    assert (a - b).abs().max() < bound * a.abs().max()
    assert not torch.equal(a, b)


@pytest.mark.parametrize("kw", [{"quantization": "int8"}, {"dtype": "bfloat16"}])
def test_llm_generates_with_reduced_weights(kw):
    llm = LLM(str(tiny_model_dir("llama")), device="cpu", num_kv_blocks=32, max_model_len=128, **kw)
    assert llm.engine.engine_core.loaded.weight_format == kw.get("quantization", "bfloat16")
    out = llm.generate([[5, 6, 7, 8], [9, 10, 11]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [6, 6]


def test_weight_format_resolution():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_weight_format("auto", None, cpu) == "float32"
    assert resolve_weight_format("float32", None, cpu) == "float32"
    assert resolve_weight_format("bfloat16", None, cpu) == "bfloat16"
    assert resolve_weight_format("bfloat16", None, cuda) == "float32"  # CUDA: bf16 compute, as before
    assert resolve_weight_format("auto", "int8", cpu) == "int8"
    with pytest.raises(ValueError, match="CPU feature"):
        resolve_weight_format("auto", "int8", cuda)
    with pytest.raises(ValueError, match="unknown quantization"):
        resolve_weight_format("auto", "int4", cpu)
    with pytest.raises(ConfigError, match="quantization"):
        EngineConfig(quantization="int4")
    assert EngineConfig().quantization is None

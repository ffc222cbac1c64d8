"""A tiny model with int8, w8a8 or bfloat16 CPU weights loads, generates, and stays close
to its float32 twin; the default stays float32."""

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


def _load(path, fmt):
    return load_model(path, **({"dtype": "bfloat16"} if fmt == "bfloat16" else {"quantization": fmt}))


@pytest.mark.parametrize("kind", ["llama", "llama3-tied", "qwen2"])
@pytest.mark.parametrize("fmt", ["int8", "bfloat16"])
def test_loads_with_reduced_weights_close_to_float32(kind, fmt):
    path = str(tiny_model_dir(kind))
    ref = load_model(path)
    red = _load(path, fmt)
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


@pytest.mark.parametrize("kind", ["llama", "llama3-tied", "qwen2"])
def test_w8a8_whole_model_stays_close_to_int8_and_float32(kind):
    """12 prompt tokens: every linear sees <= 16 rows, so each rounds its input to int8
    (kernels/cpu_linear.py W8A8Weight). Same int8 weights as the int8 format: what w8a8
    adds is the activations' rounding, bounded here against both."""
    if not cpu_linear.has_vnni():
        pytest.skip("w8a8 needs AVX512-VNNI (without it the format is int8's: test_w8a8_falls_back_...)")
    path = str(tiny_model_dir(kind))
    ref, i8, w8 = load_model(path), _load(path, "int8"), _load(path, "w8a8")
    assert w8.weight_format == "w8a8" and isinstance(w8.model.layers[0].qkv_proj.reduced, cpu_linear.W8A8Weight)
    assert isinstance(w8.model.logits_reduced, cpu_linear.W8A8Weight)
    ids = list(range(5, 17))
    a, b, c = _prompt_logits(ref, ids), _prompt_logits(i8, ids), _prompt_logits(w8, ids)
    top = a.abs().max()
    # measured worst over the kinds (of the largest logit): w8a8 - int8 2.8%, w8a8 - float32
    # 3.3%, int8 - float32 1.6% (each input element moves by up to 1/254 of its group's
    # largest |x|, at every linear of every layer)
    assert (c - b).abs().max() < 0.045 * top
    assert (c - a).abs().max() < 0.06 * top
    assert not torch.equal(c, b)


def test_w8a8_falls_back_to_int8_without_vnni(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "_VNNI", False)
    cpu_linear._warn_no_vnni.cache_clear()  # warn again in this test
    path = str(tiny_model_dir("llama"))
    with caplog.at_level("WARNING", logger="kernels.cpu_linear"):
        w8 = _load(path, "w8a8")
    assert "needs AVX512-VNNI" in caplog.text
    assert isinstance(w8.model.layers[0].qkv_proj.reduced, cpu_linear.Int8Weight)
    ids = list(range(5, 17))
    assert torch.equal(_prompt_logits(w8, ids), _prompt_logits(_load(path, "int8"), ids))


@pytest.mark.parametrize("kw", [{"quantization": "int8"}, {"quantization": "w8a8"}, {"dtype": "bfloat16"}])
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
    assert resolve_weight_format("auto", "w8a8", cpu) == "w8a8"
    assert EngineConfig(quantization="w8a8").quantization == "w8a8"
    with pytest.raises(ValueError, match="CPU feature"):
        resolve_weight_format("auto", "int8", cuda)
    with pytest.raises(ValueError, match="unknown quantization"):
        resolve_weight_format("auto", "int4", cpu)
    with pytest.raises(ConfigError, match="quantization"):
        EngineConfig(quantization="int4")
    assert EngineConfig().quantization is None


def test_a_bf16_kv_cache_holds_twice_the_blocks_and_generates_as_float32(monkeypatch):
    """kv_cache_dtype="bfloat16" (vLLM's --kv-cache-dtype): the cache is bf16, a memory
    budget holds twice the blocks, the decode kernel and the torch fallback read it alike,
    and greedy tokens stay those of the float32 cache on the tiny model."""
    from kernels import cpu_attention

    path = str(tiny_model_dir("llama"))
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 5]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs = {}
    for kv in ("auto", "bfloat16", "float32"):
        llm = LLM(path, device="cpu", kv_cache_memory=1 << 20, max_model_len=128, block_size=4, kv_cache_dtype=kv)
        core = llm.engine.engine_core
        runs[kv] = (core.scheduler.cache_config.num_blocks, core.runner.kv_caches[0][0].dtype,
                    [o.outputs[0].token_ids for o in llm.generate(prompts, params)])
        assert llm.engine.describe()["kv_cache_dtype"] == kv
    assert runs["auto"][1] == runs["float32"][1] == torch.float32 and runs["bfloat16"][1] == torch.bfloat16
    assert runs["bfloat16"][0] == 2 * runs["auto"][0] and runs["float32"][0] == runs["auto"][0]
    assert runs["bfloat16"][2] == runs["auto"][2] == runs["float32"][2]
    monkeypatch.setattr(cpu_attention.KERNELS, "on", False)  # the torch paths read it too
    llm = LLM(path, device="cpu", kv_cache_memory=1 << 20, max_model_len=128, block_size=4, kv_cache_dtype="bfloat16")
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == runs["bfloat16"][2]


def test_kv_cache_dtype_is_checked():
    from types import SimpleNamespace

    from engine.engine_core.startup import resolve_kv_cache_dtype

    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="fp8")
    cuda_bf16 = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda"))
    assert resolve_kv_cache_dtype("auto", cuda_bf16) == torch.bfloat16
    assert resolve_kv_cache_dtype("bfloat16", cuda_bf16) == torch.bfloat16
    with pytest.raises(ConfigError, match="on CUDA the KV cache takes the model's dtype"):
        resolve_kv_cache_dtype("float32", cuda_bf16)
    cpu = SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"))
    assert resolve_kv_cache_dtype("bfloat16", cpu) == torch.bfloat16

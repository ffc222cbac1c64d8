"""load_model on HF directories and GGUF files, the GGUF cache, dtype and errors."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch

from engine.model import MissingWeightsError, UnsupportedArchitectureError, load_model
from engine.model import gguf_cache
from engine.model.loader import resolve_dtype
from tests.model.refs import our_prefill_logits, reference_logits, tiny_pair
from tests.tiny_models import EOS_ID, build_tiny_gguf, tiny_model_dir


def test_hf_dir_round_trip():
    ours, ref = tiny_pair("qwen2")
    spec = ours.spec
    assert (spec.architecture, spec.num_layers, spec.num_heads, spec.num_kv_heads) == ("qwen2", 2, 4, 2)
    assert (spec.head_dim, spec.vocab_size, spec.eos_token_ids) == (16, 288, (EOS_ID,))
    assert ours.dtype == torch.float32 and ours.device.type == "cpu"
    # Fused QKV is q, k, v stacked; biases too.
    attn = ref.model.layers[0].self_attn
    qkv = ours.model.layers[0].qkv_proj
    assert torch.equal(qkv.weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(qkv.bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    text = "Paged attention, the 2nd time: ünïcode ok!"
    assert ours.tokenizer.decode(ours.tokenizer.encode(text)) == text
    chat = ours.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n")


def test_kv_bytes_per_block_from_spec():
    spec = tiny_pair("llama")[0].spec
    # 2 (K and V) * 2 layers * 16 slots * 2 kv heads * 16 dims * 4 bytes
    assert spec.kv_bytes_per_block(16, torch.float32) == 2 * 2 * 16 * 2 * 16 * 4


def test_unsupported_architecture_is_clear(tmp_path):
    path = shutil.copytree(tiny_model_dir("llama"), tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="llama, mistral, opt, qwen2"):
        load_model(str(path))


def test_missing_weights_are_listed(tmp_path):
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(tiny_model_dir("llama"), tmp_path / "m")
    weights = load_file(path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MissingWeightsError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(path))


def test_unknown_model_name():
    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        load_model("no/such-model")


def test_dtype_resolution(caplog):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg = type("Cfg", (), {"dtype": torch.float16})()
    assert resolve_dtype("auto", cpu, cfg) == torch.float32
    assert resolve_dtype("auto", cuda, cfg) == torch.float16
    assert resolve_dtype("auto", cuda, type("Cfg", (), {"dtype": "float32"})()) == torch.bfloat16
    with caplog.at_level(logging.WARNING):
        assert resolve_dtype("bfloat16", cpu, cfg) == torch.float32
    assert "float32" in caplog.text
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int8", cpu, cfg)


def test_gguf_load_is_cached_and_matches_hf(tmp_path, monkeypatch):
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    calls = []
    real = gguf_cache._dequantize_into
    monkeypatch.setattr(gguf_cache, "_dequantize_into", lambda g, out: (calls.append(g), real(g, out)))

    first = load_model(str(gguf_path), cache_dir=cache)
    second = load_model(str(gguf_path), cache_dir=cache)
    assert len(calls) == 1, "the second load must reuse the cache, not dequantize again"
    assert first.weights_dir == second.weights_dir == gguf_cache.cached_dir_for(gguf_path, cache)
    # Atomic write: only the finished entry is left, no temp dirs.
    assert [p.name for p in (cache / "gguf").iterdir()] == [first.weights_dir.name]

    # The GGUF holds the tiny HF llama (q/k permuted as llama.cpp stores them), so
    # after transformers un-permutes them we must match the HF model exactly.
    hf_loaded, ref = tiny_pair("llama")
    for name, tensor in hf_loaded.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor), name
    text = "the cat sat on the mat"
    ids = second.tokenizer.encode(text)
    assert ids == hf_loaded.tokenizer.encode(text)
    assert second.spec.eos_token_ids == (EOS_ID,)
    torch.testing.assert_close(our_prefill_logits(second, ids), reference_logits(ref, ids),
                               atol=1e-4, rtol=1e-4)


def test_gguf_cache_env_var_and_key_changes_with_file(tmp_path, monkeypatch):
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("KVSCOPE_CACHE", str(tmp_path / "envcache"))
    before = gguf_cache.cached_dir_for(gguf_path)
    assert before.parent == tmp_path / "envcache" / "gguf"
    # A new mtime gives a new key, so an edited file is never served stale.
    st = gguf_path.stat()
    os.utime(gguf_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert gguf_cache.cached_dir_for(gguf_path) != before


def test_failed_dequantize_leaves_no_cache(tmp_path, monkeypatch):
    gguf_path = build_tiny_gguf(tmp_path / "tiny.gguf")

    def boom(g, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(gguf_cache, "_dequantize_into", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        load_model(str(gguf_path), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_legacy_bin_checkpoint_without_model_prefix(tmp_path):
    # facebook/opt-125m ships pytorch_model.bin with "decoder.*" names (no "model."
    # prefix, no lm_head): it must load and match the safetensors original.
    from safetensors.torch import load_file

    src = tiny_model_dir("opt")
    path = tmp_path / "opt-legacy"
    shutil.copytree(src, path, ignore=shutil.ignore_patterns("*.safetensors"))
    weights = load_file(src / "model.safetensors")
    legacy = {k.removeprefix("model."): v for k, v in weights.items() if k != "lm_head.weight"}
    torch.save(legacy, path / "pytorch_model.bin")
    loaded = load_model(str(path))
    original, ref = tiny_pair("opt")
    ids = original.tokenizer.encode("hello paged world")
    torch.testing.assert_close(our_prefill_logits(loaded, ids), reference_logits(ref, ids),
                               atol=1e-4, rtol=1e-4)

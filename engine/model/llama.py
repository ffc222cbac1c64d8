"""Llama-family forward pass over the paged KV cache: Llama, SmolLM2, Qwen2, Mistral.

The families differ only in which projections carry a bias:
Llama: config.attention_bias (q/k/v/o) and config.mlp_bias; Qwen2: q/k/v only;
Mistral: none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.base import CausalLM, empty_param
from engine.model.kv_cache import KVCache
from engine.model.layers import (
    GatedActivation, Linear, PackedWeightCache, RMSNorm, RopeTables, RotaryEmbedding, reduced_weight,
    rope_settings,
)


@dataclass(frozen=True, slots=True)
class LlamaDims:
    """Shapes and flags of one Llama-family model, read from its HF config."""

    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_layers: int
    vocab: int
    rms_eps: float
    act: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tied: bool

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if min(self.hidden, self.head_dim, self.num_layers, self.vocab) <= 0:
            raise ValueError(f"invalid model dimensions: {self}")

    @classmethod
    def from_config(cls, config: Any) -> "LlamaDims":
        """Read dims from a LlamaConfig / Qwen2Config / MistralConfig."""
        kind = config.model_type
        heads = config.num_attention_heads
        attn_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            num_layers=config.num_hidden_layers,
            vocab=config.vocab_size,
            rms_eps=config.rms_norm_eps,
            act=config.hidden_act,
            qkv_bias=True if kind == "qwen2" else (attn_bias if kind == "llama" else False),
            o_bias=attn_bias if kind == "llama" else False,
            mlp_bias=bool(getattr(config, "mlp_bias", False)) if kind == "llama" else False,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
        )


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention + gated MLP, each with a residual."""

    def __init__(self, d: LlamaDims) -> None:
        super().__init__()
        self.d = d
        self.scale = d.head_dim**-0.5
        q_size, kv_size = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        self.input_layernorm = RMSNorm(d.hidden, d.rms_eps)
        self.qkv_proj = Linear(d.hidden, q_size + 2 * kv_size, bias=d.qkv_bias)
        self.o_proj = Linear(q_size, d.hidden, bias=d.o_bias)
        self.post_attention_layernorm = RMSNorm(d.hidden, d.rms_eps)
        self.gate_up_proj = Linear(d.hidden, 2 * d.intermediate, bias=d.mlp_bias)
        self.down_proj = Linear(d.intermediate, d.hidden, bias=d.mlp_bias)
        self.act = GatedActivation(d.act)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden], the residual stream: updated in place
        pending: torch.Tensor | None,  # the previous layer's MLP output, not yet added to h
        rope: RopeTables,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """This layer's MLP output, for the next layer (or the final norm) to add to ``h``.

        Each residual add is folded into the norm that follows it (vLLM's fused
        add + RMSNorm): the same float32 sums as ``h + x``, one pass over ``h`` fewer."""
        d, T = self.d, h.shape[0]
        q_size, kv_size = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        # bfloat16 where the linears multiply in bf16 (kernels/cpu_linear.py): the norms and
        # SiLU write their GEMMs' inputs as bf16, and o_proj's and the MLP's outputs stay
        # bf16 into the fused ops; the residual stream, RoPE and attention stay float32
        io = self.qkv_proj.input_dtype(T)
        normed = (self.input_layernorm(h).to(io) if pending is None
                  else self.input_layernorm.add_and_norm(pending, h, io))
        qkv = self.qkv_proj(normed).float()  # [T, q_size + 2 * kv_size]; float32 as it was
        # q and k heads rotated together (one strided view of the fused output), then
        # split back as views; v stays a view too (the cache write copies it)
        qk = rope.apply(qkv[:, : q_size + kv_size].view(T, d.num_heads + d.num_kv_heads, d.head_dim))
        q, k = qk[:, : d.num_heads], qk[:, d.num_heads:]
        v = qkv[:, q_size + kv_size:].view(T, d.num_kv_heads, d.head_dim)
        key_cache, value_cache = kv_cache
        backend.write_kv(k, v, key_cache, value_cache, meta)
        attn = backend.attend(q, key_cache, value_cache, meta, self.scale)  # [T, heads, hd]
        # h += o_proj(attn) in place, normed in the same pass
        normed = self.post_attention_layernorm.add_and_norm(self.o_proj(attn.reshape(T, q_size).to(io)), h, io)
        return self.down_proj(self.act(self.gate_up_proj(normed), io))


class LlamaForCausalLM(CausalLM):
    """Our Llama-family model; weights come from an HF Llama/Qwen2/Mistral checkpoint."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        d = LlamaDims.from_config(config)
        self.d = d
        self.num_layers, self.num_kv_heads, self.head_dim = d.num_layers, d.num_kv_heads, d.head_dim
        theta, scaling = rope_settings(config)
        self.rotary = RotaryEmbedding(d.head_dim, theta, scaling)
        self.embed_tokens = empty_param(d.vocab, d.hidden)
        self.layers = nn.ModuleList(LlamaDecoderLayer(d) for _ in range(d.num_layers))
        self.norm = RMSNorm(d.hidden, d.rms_eps)
        self.lm_head = None if d.tied else empty_param(d.vocab, d.hidden)
        self.logits_packed = PackedWeightCache()  # the lm_head is the largest GEMM of a decode
        self.logits_reduced = None  # int8 / bf16 lm_head after reduce_precision

    def weight_sources(self) -> dict[str, list[str]]:
        d = self.d
        src: dict[str, list[str]] = {
            "embed_tokens": ["model.embed_tokens.weight"],
            "norm.weight": ["model.norm.weight"],
        }
        if not d.tied:
            src["lm_head"] = ["lm_head.weight"]
        for i in range(d.num_layers):
            ours, hf = f"layers.{i}.", f"model.layers.{i}."
            attn, mlp = hf + "self_attn.", hf + "mlp."
            src[ours + "input_layernorm.weight"] = [hf + "input_layernorm.weight"]
            src[ours + "post_attention_layernorm.weight"] = [hf + "post_attention_layernorm.weight"]
            for kind, on in (("weight", True), ("bias", d.qkv_bias)):
                if on:
                    src[ours + f"qkv_proj.{kind}"] = [attn + f"{p}_proj.{kind}" for p in "qkv"]
            for kind, on in (("weight", True), ("bias", d.o_bias)):
                if on:
                    src[ours + f"o_proj.{kind}"] = [attn + f"o_proj.{kind}"]
            for kind, on in (("weight", True), ("bias", d.mlp_bias)):
                if on:
                    src[ours + f"gate_up_proj.{kind}"] = [mlp + f"gate_proj.{kind}", mlp + f"up_proj.{kind}"]
                    src[ours + f"down_proj.{kind}"] = [mlp + f"down_proj.{kind}"]
        return src

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"need {self.num_layers} KV caches, got {len(kv_caches)}")
        h = self.embed_tokens[input_ids]  # [T, hidden]; a copy, so the layers may add into it
        rope = self.rotary.tables(positions, h.dtype)  # shared by every layer
        pending = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            pending = layer(h, pending, rope, meta, kv_cache, backend)
        return self.norm(h) if pending is None else self.norm.add_and_norm(pending, h)

    @property
    def logits_weight(self) -> torch.Tensor:
        """The lm_head's float32 weight: the embedding where the two are tied."""
        return self.embed_tokens if self.lm_head is None else self.lm_head

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.logits_reduced is not None:
            return self.logits_reduced.linear(hidden, None)
        return self.logits_packed.linear(hidden, self.logits_weight, None)  # [R, vocab]

    def reduce_precision(self, fmt: str) -> None:
        """Every linear and the lm_head as ``fmt``; a tied embedding keeps its float32
        rows for lookups (one row per token: not what a step streams)."""
        super().reduce_precision(fmt)
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        self.logits_reduced = reduced_weight(weight, fmt)
        if self.lm_head is not None:
            self.lm_head = nn.Parameter(torch.empty(0), requires_grad=False)

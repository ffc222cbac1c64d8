"""OPT forward pass over the paged KV cache (facebook/opt-125m architecture).

Learned absolute positions (table offset by 2, an OPT quirk), LayerNorm, ReLU MLP,
pre-LN when `do_layer_norm_before` (125m and most sizes) and post-LN otherwise (350m),
and project_in/out when word embeddings are narrower than the hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.base import CausalLM, empty_param
from engine.model.kv_cache import KVCache
from engine.model.layers import LayerNorm, Linear, activation

POSITION_OFFSET = 2  # OPT's position table reserves its first two rows


@dataclass(frozen=True, slots=True)
class OPTDims:
    """Shapes and flags of one OPT model, read from its HF config."""

    hidden: int
    ffn: int
    num_heads: int
    num_layers: int
    vocab: int
    embed_dim: int  # word_embed_proj_dim
    max_positions: int
    pre_ln: bool
    final_ln: bool
    bias: bool
    ln_affine: bool
    act: str

    def __post_init__(self) -> None:
        if self.hidden % self.num_heads:
            raise ValueError(f"hidden {self.hidden} not divisible by heads {self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @classmethod
    def from_config(cls, config: Any) -> "OPTDims":
        """Read dims from an OPTConfig."""
        pre_ln = bool(config.do_layer_norm_before)
        return cls(
            hidden=config.hidden_size,
            ffn=config.ffn_dim,
            num_heads=config.num_attention_heads,
            num_layers=config.num_hidden_layers,
            vocab=config.vocab_size,
            embed_dim=config.word_embed_proj_dim or config.hidden_size,
            max_positions=config.max_position_embeddings,
            pre_ln=pre_ln,
            final_ln=pre_ln and not getattr(config, "_remove_final_layer_norm", False),
            bias=bool(getattr(config, "enable_bias", True)),
            ln_affine=bool(getattr(config, "layer_norm_elementwise_affine", True)),
            act=config.activation_function,
        )


class OPTDecoderLayer(nn.Module):
    """Attention + MLP with residuals; LayerNorm before (pre-LN) or after each."""

    def __init__(self, d: OPTDims) -> None:
        super().__init__()
        self.d = d
        self.scale = d.head_dim**-0.5
        self.self_attn_layer_norm = LayerNorm(d.hidden, d.ln_affine)
        self.qkv_proj = Linear(d.hidden, 3 * d.hidden, bias=d.bias)
        self.out_proj = Linear(d.hidden, d.hidden, bias=d.bias)
        self.final_layer_norm = LayerNorm(d.hidden, d.ln_affine)
        self.fc1 = Linear(d.hidden, d.ffn, bias=d.bias)
        self.fc2 = Linear(d.ffn, d.hidden, bias=d.bias)
        self.act = activation(d.act)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        meta: AttentionMetadata,
        kv_cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        d, T = self.d, h.shape[0]
        x = self.self_attn_layer_norm(h) if d.pre_ln else h
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # [T, hidden] each
        # OPT scales q before attention (not the scores); same order as transformers.
        q = (q * self.scale).reshape(T, d.num_heads, d.head_dim)
        k = k.reshape(T, d.num_heads, d.head_dim).contiguous()
        v = v.reshape(T, d.num_heads, d.head_dim).contiguous()
        key_cache, value_cache = kv_cache
        backend.write_kv(k, v, key_cache, value_cache, meta)
        attn = backend.attend(q, key_cache, value_cache, meta, 1.0)  # [T, heads, hd]
        h = h + self.out_proj(attn.reshape(T, d.hidden))
        if not d.pre_ln:
            h = self.self_attn_layer_norm(h)
        x = self.final_layer_norm(h) if d.pre_ln else h
        h = h + self.fc2(self.act(self.fc1(x)))
        if not d.pre_ln:
            h = self.final_layer_norm(h)
        return h


class OPTForCausalLM(CausalLM):
    """Our OPT model; weights come from an HF OPT checkpoint. LM head is tied."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        d = OPTDims.from_config(config)
        self.d = d
        self.num_layers, self.num_kv_heads, self.head_dim = d.num_layers, d.num_heads, d.head_dim
        self.tied = bool(getattr(config, "tie_word_embeddings", True))
        self.embed_tokens = empty_param(d.vocab, d.embed_dim)
        self.embed_positions = empty_param(d.max_positions + POSITION_OFFSET, d.hidden)
        projected = d.embed_dim != d.hidden
        self.project_in = Linear(d.embed_dim, d.hidden, bias=False) if projected else None
        self.project_out = Linear(d.hidden, d.embed_dim, bias=False) if projected else None
        self.layers = nn.ModuleList(OPTDecoderLayer(d) for _ in range(d.num_layers))
        self.final_layer_norm = LayerNorm(d.hidden, d.ln_affine) if d.final_ln else None
        self.lm_head = None if self.tied else empty_param(d.vocab, d.embed_dim)

    def weight_sources(self) -> dict[str, list[str]]:
        d = self.d
        dec = "model.decoder."
        src: dict[str, list[str]] = {
            "embed_tokens": [dec + "embed_tokens.weight"],
            "embed_positions": [dec + "embed_positions.weight"],
        }
        if not self.tied:
            src["lm_head"] = ["lm_head.weight"]
        if self.project_in is not None:
            src["project_in.weight"] = [dec + "project_in.weight"]
            src["project_out.weight"] = [dec + "project_out.weight"]
        kinds = ("weight", "bias")
        if self.final_layer_norm is not None and d.ln_affine:
            for kind in kinds:
                src[f"final_layer_norm.{kind}"] = [dec + f"final_layer_norm.{kind}"]
        for i in range(d.num_layers):
            ours, hf = f"layers.{i}.", f"{dec}layers.{i}."
            for kind in kinds if d.bias else ("weight",):
                src[ours + f"qkv_proj.{kind}"] = [hf + f"self_attn.{p}_proj.{kind}" for p in "qkv"]
                src[ours + f"out_proj.{kind}"] = [hf + f"self_attn.out_proj.{kind}"]
                src[ours + f"fc1.{kind}"] = [hf + f"fc1.{kind}"]
                src[ours + f"fc2.{kind}"] = [hf + f"fc2.{kind}"]
            if d.ln_affine:
                for ln in ("self_attn_layer_norm", "final_layer_norm"):
                    for kind in kinds:
                        src[ours + f"{ln}.{kind}"] = [hf + f"{ln}.{kind}"]
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
        h = self.embed_tokens[input_ids]  # [T, embed_dim]
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + self.embed_positions[positions + POSITION_OFFSET]  # [T, hidden]
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, meta, kv_cache, backend)
        if self.final_layer_norm is not None:
            h = self.final_layer_norm(h)
        if self.project_out is not None:
            h = self.project_out(h)
        return h  # [T, embed_dim]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return torch.nn.functional.linear(hidden, weight)  # [R, vocab]

"""Tiny random-weight models (and a tiny GGUF) for tests, built from transformers configs.

Every model is 2 layers, hidden 64, 4 heads (2 KV heads where the family has GQA),
with a 288-token byte-level BPE tokenizer that round-trips any text and a ChatML
chat template. Weights are seeded, so a kind always builds the same model.

    from tests.tiny_models import tiny_model_dir
    path = tiny_model_dir("llama")          # built once per session, then reused
    loaded = load_model(str(path))
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch

KINDS = ("llama", "llama3-tied", "qwen2", "mistral", "opt", "opt-proj")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
# A few common English merges so text is not all single bytes (ids 259..287).
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a"), ("i", "n"), ("e", "r"), ("o", "n"),
    ("r", "e"), ("a", "n"), ("Ġ", "s"), ("Ġ", "w"), ("o", "u"), ("e", "n"), ("Ġ", "o"),
    ("a", "t"), ("Ġ", "c"), ("i", "s"), ("o", "r"), ("e", "s"), ("Ġ", "b"), ("Ġ", "f"),
    ("Ġ", "m"), ("l", "l"), ("Ġ", "i"), ("in", "g"), ("Ġ", "p"), ("e", "d"), ("Ġ", "h"),
    ("a", "r"),
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    """(tokens in id order, merges): specials, the 256 byte symbols, merged tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = list(SPECIALS) + sorted(ByteLevel.alphabet())
    tokens += [a + b for a, b in MERGES]
    assert len(set(tokens)) == len(tokens) == 288
    return tokens, list(MERGES)


VOCAB_SIZE = 288


def build_tokenizer(out_dir: Path):
    """Save a byte-level BPE tokenizer (PreTrainedTokenizerFast) into out_dir."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens, merges = tokenizer_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[BOS_ID], eos_token=SPECIALS[EOS_ID],
        pad_token=SPECIALS[PAD_ID],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def tiny_config(kind: str):
    """The transformers config for one tiny model kind (see KINDS)."""
    from transformers import LlamaConfig, MistralConfig, OPTConfig, Qwen2Config

    common = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512,
                  bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    gqa = dict(common, intermediate_size=128, num_key_value_heads=2, rms_norm_eps=1e-5)
    if kind == "llama":
        return LlamaConfig(**gqa, rope_theta=10000.0, tie_word_embeddings=False)
    if kind == "llama3-tied":  # Llama-3 rope scaling, q/k/v/o and MLP biases, tied head
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        return LlamaConfig(**gqa, rope_theta=500.0, rope_scaling=scaling,
                           attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    if kind == "qwen2":
        return Qwen2Config(**gqa, rope_theta=1000000.0, tie_word_embeddings=True)
    if kind == "mistral":
        return MistralConfig(**gqa, rope_theta=10000.0, sliding_window=None,
                             tie_word_embeddings=False)
    if kind == "opt":
        return OPTConfig(**common, ffn_dim=128, word_embed_proj_dim=64,
                         do_layer_norm_before=True)
    if kind == "opt-proj":  # opt-350m style: narrower word embeddings, post-LN
        return OPTConfig(**common, ffn_dim=128, word_embed_proj_dim=32,
                         do_layer_norm_before=False)
    raise ValueError(f"unknown tiny model kind {kind!r}; choose from {KINDS}")


def build_hf_model(kind: str, seed: int = 0):
    """A tiny transformers model with seeded weights large enough to give varied logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.1 * noise)  # norm gains near 1
            elif p.dim() == 1:
                p.copy_(0.1 * noise)  # biases: nonzero so bias wiring is tested
            else:
                p.copy_(noise * (0.5 if "embed" in name else 0.15))
    return model.eval()


def build_tiny_model(kind: str, out_dir: Path, seed: int = 0) -> Path:
    """Save a tiny model of `kind` with its tokenizer into out_dir; return out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_hf_model(kind, seed).save_pretrained(str(out_dir))
    build_tokenizer(out_dir)
    return out_dir


_session_root: Path | None = None
_built: dict[str, Path] = {}


def tiny_model_dir(kind: str) -> Path:
    """Path to a tiny model of `kind`, built once per process in a temp dir."""
    global _session_root
    if kind not in _built:
        if _session_root is None:
            _session_root = Path(tempfile.mkdtemp(prefix="kvscope-tiny-"))
            atexit.register(shutil.rmtree, _session_root, ignore_errors=True)
        _built[kind] = build_tiny_model(kind, _session_root / kind)
    return _built[kind]


def _llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    # llama.cpp stores q/k rows interleaved per rotary pair; transformers undoes this
    # on load, so writing it this way makes the GGUF model equal the HF one.
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build_tiny_gguf(out_path: Path, seed: int = 0) -> Path:
    """Write the tiny "llama" model (F32 tensors) as a GGUF file, as llama.cpp would."""
    import gguf

    model, cfg = build_hf_model("llama", seed), tiny_config("llama")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    tokens, merges = tokenizer_vocab()
    w = gguf.GGUFWriter(str(out_path), "llama")
    w.add_name("tiny llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(VOCAB_SIZE)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3 = control
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    w.add_tensor("output.weight", sd["lm_head.weight"].numpy())
    for i in range(cfg.num_hidden_layers):
        for hf, short in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if short in ("attn_q", "attn_k"):
                heads = cfg.num_attention_heads if short == "attn_q" else cfg.num_key_value_heads
                t = _llama_cpp_permute(t, heads)
            w.add_tensor(f"blk.{i}.{short}.weight", t.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out_path)

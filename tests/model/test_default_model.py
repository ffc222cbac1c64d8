"""The real default model (SmolLM2-135M-Instruct from its Q4_1 GGUF) against transformers.

Both sides read the same dequantized weights (our GGUF cache directory), so any
difference is in the forward pass. The first run on a machine dequantizes the GGUF
(~20 s) into $KVSCOPE_CACHE; later runs reuse it.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.model import TorchAttentionBackend, allocate_kv_caches, load_model
from tests.model.paged_batch import PagedBatchBuilder
from tests.model.refs import our_prefill_logits

pytestmark = pytest.mark.slow



@functools.lru_cache(maxsize=1)
def _pair():
    from transformers import AutoModelForCausalLM

    ours = load_model("smollm2-135m")
    ref = AutoModelForCausalLM.from_pretrained(
        str(ours.weights_dir), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return ours, ref


def _prompt_ids(tokenizer) -> list[int]:
    messages = [{"role": "user", "content": "What is a KV cache? Answer in one sentence."}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True),
                            add_special_tokens=False)


def test_spec_matches_design():
    ours, _ = _pair()
    s = ours.spec
    assert (s.architecture, s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads,
            s.head_dim, s.vocab_size) == ("llama", 30, 576, 9, 3, 64, 49152)
    assert ours.tokenizer.decode(list(s.eos_token_ids)) == "<|im_end|>"


def test_prefill_logits_match_transformers():
    ours, ref = _pair()
    ids = _prompt_ids(ours.tokenizer)
    with torch.inference_mode():
        want = ref(torch.tensor([ids]), use_cache=False).logits[0]
    got = our_prefill_logits(ours, ids)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)


def test_greedy_decode_matches_transformers():
    # 16 greedy steps through our paged cache (block size 16, shuffled blocks) must
    # produce transformers' own greedy continuation.
    ours, ref = _pair()
    spec = ours.spec
    ids = _prompt_ids(ours.tokenizer)
    caches = allocate_kv_caches(spec.num_layers, 16, 16, spec.num_kv_heads, spec.head_dim,
                                torch.float32, "cpu")
    builder = PagedBatchBuilder(16, 16, seed=0)
    backend = TorchAttentionBackend()
    generated: list[int] = []
    chunk = ids
    for _ in range(16):
        input_ids, positions, meta, _ = builder.step([("a", chunk)])
        hidden = ours.model(input_ids, positions, meta, caches, backend)
        token = int(ours.model.compute_logits(hidden[-1:]).argmax(-1))
        generated.append(token)
        chunk = [token]
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                           eos_token_id=None, pad_token_id=spec.eos_token_ids[0])
    assert generated == out[0, len(ids):].tolist(), ours.tokenizer.decode(generated)

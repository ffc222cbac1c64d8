"""The default model, SmolLM2-135M-Instruct from the GGUF shipped on PyPI, token-exact."""

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

CHATS = [
    [{"role": "user", "content": "Explain in detail how a computer's memory works."}],
    [{"role": "user", "content": "Write a long story about a robot who learns to paint."}],
    [{"role": "system", "content": "You are a helpful teacher."},
     {"role": "user", "content": "List ten facts about the ocean."}],
]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, num_kv_blocks=256)


def test_greedy_equals_transformers_on_three_chats(llm):
    from transformers import AutoModelForCausalLM

    weights = llm.engine.engine_core.loaded.weights_dir
    hf = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).eval()
    ours = llm.chat(CHATS, SamplingParams(temperature=0, max_tokens=32))
    for out in ours:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.inference_mode():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=32, eos_token_id=list(llm.engine.engine_core.loaded.spec.eos_token_ids),
                              pad_token_id=llm.engine.engine_core.loaded.spec.eos_token_ids[0])
        assert len(out.outputs[0].token_ids) == 32  # the prompts ask for long answers
        assert out.outputs[0].token_ids == ref[0, ids.shape[1]:].tolist()


def test_capital_of_france_is_paris(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=20))
    assert "Paris" in out[0].outputs[0].text

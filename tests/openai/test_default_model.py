"""The OpenAI API on the default model (SmolLM2-135M-Instruct): token-exact with LLM."""

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.server.app import KVScopeServer, ServerOptions
from tests.openai.conftest import client_for

pytestmark = pytest.mark.slow

SHAPE = dict(max_model_len=512, num_kv_blocks=256)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server():
    s = KVScopeServer(ServerOptions(EngineConfig(**SHAPE), port=0, record=False)).start()
    assert s.wait_ready(600).status.value == "ready"
    yield s
    s.stop()


def test_greedy_chat_through_the_api_equals_llm_chat(server):
    want = LLM(**SHAPE).chat(CHAT, SamplingParams(temperature=0, max_tokens=20))[0].outputs[0]
    with client_for(server) as c:
        assert c.models.list().data[0].id == "smollm2-135m"
        r = c.chat.completions.create(model="smollm2-135m", messages=CHAT, temperature=0,
                                      max_tokens=20, extra_body={"return_token_ids": True})
        assert r.choices[0].token_ids == want.token_ids
        assert r.choices[0].message.content == want.text and "Paris" in want.text
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="smollm2-135m", messages=CHAT, temperature=0, max_tokens=20, stream=True))
        assert streamed == want.text

"""vLLM's extras and the OpenAI gaps vLLM's own server tests found, through the official
``openai`` client (raw HTTP where a client cannot send it: a content type, an empty model).

Values are checked against the engine itself (the same prompt without the extra) or the
tiny model's own forward; their equality with a real vLLM is tests/vllm/test_openai_bodies.py.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.openai.conftest import NO_EOS, SERVED, post

PROMPT = "prompt number 0"


def _completion(client, **kw):
    extra = {**NO_EOS, **kw.pop("extra_body", {})}
    return client.completions.create(model=SERVED, prompt=kw.pop("prompt", PROMPT), temperature=0,
                                     extra_body=extra, **kw)


def test_return_token_ids_gives_the_prompts_token_ids_everywhere(client):
    r = _completion(client, max_tokens=3, extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert len(c.prompt_token_ids) == r.usage.prompt_tokens and len(c.token_ids) == 3
    stream = list(_completion(client, max_tokens=3, stream=True, extra_body={"return_token_ids": True}))
    assert stream[0].choices[0].prompt_token_ids == c.prompt_token_ids  # the first chunk only
    assert all(ch.choices[0].prompt_token_ids is None for ch in stream[1:])
    assert [t for ch in stream for t in ch.choices[0].token_ids] == c.token_ids
    msgs = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=SERVED, messages=msgs, max_tokens=2, temperature=0,
                                          extra_body={"return_token_ids": True, **NO_EOS})
    assert len(chat.prompt_token_ids) == chat.usage.prompt_tokens
    chunks = list(client.chat.completions.create(model=SERVED, messages=msgs, max_tokens=2,
                                                 temperature=0, stream=True,
                                                 extra_body={"return_token_ids": True, **NO_EOS}))
    assert chunks[0].prompt_token_ids == chat.prompt_token_ids
    assert [t for ch in chunks[1:] for t in ch.choices[0].token_ids] == chat.choices[0].token_ids


def test_truncate_prompt_tokens_keeps_the_last_k(client):
    whole = _completion(client, max_tokens=2, extra_body={"return_token_ids": True})
    ids = whole.choices[0].prompt_token_ids
    cut = _completion(client, max_tokens=2, extra_body={"return_token_ids": True,
                                                        "truncate_prompt_tokens": 2})
    assert cut.usage.prompt_tokens == 2 and cut.choices[0].prompt_token_ids == ids[-2:]
    right = _completion(client, max_tokens=2, extra_body={"return_token_ids": True, "truncate_prompt_tokens": 2,
                                                          "truncation_side": "right"})
    assert right.choices[0].prompt_token_ids == ids[:2]
    # the same tokens sent as the prompt answer the same
    direct = _completion(client, prompt=ids[-2:], max_tokens=2, extra_body={"return_token_ids": True})
    assert direct.choices[0].token_ids == cut.choices[0].token_ids
    with pytest.raises(openai.BadRequestError) as e:
        _completion(client, max_tokens=2, extra_body={"truncate_prompt_tokens": 10 ** 5})
    assert e.value.body["param"] == "truncate_prompt_tokens"


def test_allowed_token_ids_and_logit_bias_steer_the_sample(client):
    allowed = [11, 12, 13]
    r = _completion(client, max_tokens=6, extra_body={"return_token_ids": True, "allowed_token_ids": allowed})
    assert set(r.choices[0].token_ids) <= set(allowed)
    r = _completion(client, max_tokens=4, logit_bias={"42": 100}, extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == [42] * 4


def test_continuous_usage_stats_put_usage_in_every_chunk(client):
    chunks = list(_completion(client, max_tokens=4, stream=True,
                              stream_options={"include_usage": True, "continuous_usage_stats": True}))
    *body, last = chunks
    prompt = last.usage.prompt_tokens
    counts = [c.usage.completion_tokens for c in body]
    assert counts == sorted(counts) and counts[-1] == 4
    assert all(c.usage.prompt_tokens == prompt and c.usage.total_tokens == prompt + c.usage.completion_tokens
               for c in body)


def test_prompt_logprobs_zero_and_echo_with_logprobs(client):
    r = _completion(client, max_tokens=1, extra_body={"prompt_logprobs": 0, "return_token_ids": True})
    c = r.choices[0]
    plp = c.prompt_logprobs
    assert len(plp) == r.usage.prompt_tokens and plp[0] is None
    # each entry holds exactly the prompt token (no alternatives at 0)
    assert [list(e) for e in plp[1:]] == [[str(t)] for t in c.prompt_token_ids[1:]]
    # echo + logprobs (lm-eval's loglikelihood): the prompt's tokens, then the answer's,
    # with the same values the prompt logprobs gave
    e = _completion(client, max_tokens=1, logprobs=1, echo=True)
    lp = e.choices[0].logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens + 1 and e.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:-1] == pytest.approx(
        [next(iter(x.values()))["logprob"] for x in plp[1:]], abs=1e-6)
    assert lp.text_offset[0] == 0
    only = _completion(client, max_tokens=0, logprobs=0, echo=True)
    assert only.choices[0].text == PROMPT and len(only.choices[0].logprobs.tokens) == r.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as err:
        _completion(client, max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_prompt_logprobs_in_chat_and_the_developer_role(client):
    msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    r = client.chat.completions.create(model=SERVED, messages=msgs, max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 1, **NO_EOS})
    plp = r.model_extra["prompt_logprobs"]
    assert len(plp) == r.usage.prompt_tokens and plp[0] is None and all(1 <= len(e) <= 2 for e in plp[1:])


@pytest.mark.parametrize("kw, param", [
    ({"extra_body": {"stop_token_ids": [10 ** 6]}}, "stop_token_ids"),
    ({"extra_body": {"allowed_token_ids": [10 ** 6]}}, "allowed_token_ids"),
    ({"logit_bias": {str(10 ** 6): 1}}, "logit_bias"),
    ({"extra_body": {"structured_outputs": {"regex": "[a-z]+"}}}, "structured_outputs"),
    ({"extra_body": {"response_format": {"type": "json_object"}}}, "response_format"),
    ({"extra_body": {"guided_choice": ["a", "b"]}}, "guided_choice"),
    ({"extra_body": {"made_up_knob": 1}}, "made_up_knob"),
    ({"stream": True, "extra_body": {"prompt_logprobs": 2}}, "prompt_logprobs"),
])
def test_what_kvscope_cannot_honour_is_a_400_naming_it(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        _completion(client, max_tokens=1, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param


def test_empty_model_health_and_content_type(server):
    status, _, body = post(server, "/v1/completions", {"model": "", "prompt": PROMPT, "max_tokens": 1})
    assert status == 200 and json.loads(body)["model"] == SERVED  # the served model, as vLLM
    status, headers, body = post(server, "/health", None, method="GET")
    assert (status, body) == (200, b"")
    raw = json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode()
    status, _, body = post(server, "/v1/completions", raw, {"Content-Type": "text/plain"})
    err = json.loads(body)["error"]
    assert status == 400 and err["message"] == "Unsupported Media Type: Only 'application/json' is allowed"


def test_developer_messages_become_system_ones_where_the_template_lacks_the_role():
    from engine.tokenizer import developer_as_system

    dev, user = {"role": "developer", "content": "d"}, {"role": "user", "content": "u"}
    assert developer_as_system([dev, user], "") == [{"role": "system", "content": "d"}, user]
    # several system messages, or one not first, merge at the front (vLLM's consolidation)
    assert developer_as_system([{"role": "system", "content": "s"}, user, dev], "") == [
        {"role": "system", "content": "s\n\nd"}, user]
    assert developer_as_system([dev, user], "{% if m['role'] == 'developer' %}") == [dev, user]

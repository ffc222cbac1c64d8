"""The official ``openai`` client against a live server on the tiny Llama: the happy paths."""

import json

import pytest

from engine import LLM, SamplingParams
from tests.openai.conftest import ENGINE, GREEDY, NO_EOS, client_for, post

CHAT = [{"role": "user", "content": "hello there"}]


def test_models_lists_the_served_model(client, server):
    (model,) = client.models.list().data
    assert model.id == "llama" and model.object == "model" and model.owned_by == "kvscope"
    assert model.max_model_len == 64
    assert client.models.list().data[0].id == server.options.model_name


def test_completion_shape_and_usage(client):
    r = client.completions.create(model="llama", prompt="hello world", extra_body=NO_EOS, **GREEDY)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == "llama"
    (choice,) = r.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.logprobs is None
    assert choice.stop_reason is None  # vLLM's extra field, null when the length ran out
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_shape(client):
    r = client.chat.completions.create(model="llama", messages=CHAT, extra_body=NO_EOS, **GREEDY)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 6


def test_streamed_text_equals_non_streamed_with_usage(client):
    for prompt in ("prompt number 0", "prompt number 3"):  # outputs with split multi-byte chars
        kw = dict(model="llama", prompt=prompt, temperature=0, max_tokens=30, extra_body=NO_EOS)
        whole = client.completions.create(**kw)
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                                **kw))
        *body, last = chunks
        assert last.choices == [] and last.usage.completion_tokens == 30
        assert last.usage.prompt_tokens == whole.usage.prompt_tokens
        assert all(c.usage is None for c in body)
        assert "".join(c.choices[0].text for c in body) == whole.choices[0].text
        assert [c.choices[0].finish_reason for c in body][-1] == "length"
        assert all(c.choices[0].finish_reason is None for c in body[:-1])
        assert len({c.id for c in chunks}) == 1
    msgs = [{"role": "user", "content": "prompt number 0"}]
    kw = dict(model="llama", messages=msgs, temperature=0, max_tokens=30, extra_body=NO_EOS)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    # as vLLM's: the finish rides the last piece of content
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content for c in chunks[1:]) == whole.choices[0].message.content


def test_multibyte_characters_split_over_tokens_stream_whole(client):
    # Byte-level tokens: the exact bytes of each token rebuild the text, and the text holds
    # characters whose bytes came in different tokens; the stream carries them intact.
    kw = dict(model="llama", messages=[{"role": "user", "content": "prompt number 0"}],
              temperature=0, max_tokens=30, logprobs=True, extra_body=NO_EOS)
    whole = client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    pieces = [bytes(t.bytes) for t in whole.choices[0].logprobs.content]
    assert b"".join(pieces).decode("utf-8", "replace") == text
    split = [ch for ch in text if len(ch.encode()) > 1 and ch != "\ufffd"
             and ch.encode() not in pieces]
    assert split, "the prompt should produce a character spread over tokens"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **kw))
    assert streamed == text and all(ch in streamed for ch in split)


def test_n3_with_seed_is_repeatable_and_interleaves(client):
    kw = dict(model="llama", prompt="sample me", n=3, temperature=1.0, seed=1234, max_tokens=8,
              extra_body=NO_EOS)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # three samples, not one copied
    other = client.completions.create(**{**kw, "seed": 99})
    assert [c.text for c in other.choices] != [c.text for c in a.choices]
    indices = [c.choices[0].index for c in client.completions.create(stream=True, **kw)]
    assert set(indices) == {0, 1, 2} and indices != sorted(indices)  # interleaved by index
    texts = {i: "" for i in range(3)}
    for c in client.completions.create(stream=True, **kw):
        texts[c.choices[0].index] += c.choices[0].text
    assert [texts[i] for i in range(3)] == [c.text for c in a.choices]


def test_stop_strings_and_stop_token_ids(client):
    base = client.completions.create(model="llama", prompt="prompt number 7", temperature=0,
                                     max_tokens=20, extra_body=NO_EOS)
    text = base.choices[0].text
    stop = next(ch for ch in text[2:] if ch.isascii() and ch.isalnum())
    r = client.completions.create(model="llama", prompt="prompt number 7", temperature=0,
                                  max_tokens=20, stop=[stop], extra_body=NO_EOS)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason == stop
    assert r.choices[0].text == text[:text.index(stop)]
    ids = client.completions.create(model="llama", prompt="prompt number 7", temperature=0,
                                    max_tokens=20, extra_body={**NO_EOS, "return_token_ids": True})
    third = ids.choices[0].token_ids[2]
    r = client.completions.create(model="llama", prompt="prompt number 7", temperature=0,
                                  max_tokens=20, extra_body={**NO_EOS, "stop_token_ids": [third]})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].stop_reason == third
    assert r.usage.completion_tokens == ids.choices[0].token_ids.index(third) + 1


def test_logprobs_in_each_endpoints_format(client):
    # token_id:N names: the tiny model's byte tokens often decode to the same "\ufffd"
    ids = {**NO_EOS, "return_tokens_as_token_ids": True, "return_token_ids": True}
    r = client.completions.create(model="llama", prompt="log me", logprobs=2, extra_body=ids, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.tokens == [f"token_id:{t}" for t in r.choices[0].token_ids]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[tok] == chosen
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the top token
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model="llama", prompt="log me", logprobs=2, stream=True, extra_body=ids, **GREEDY)]
    # (the second run reads the prompt's K/V from the prefix cache: same tokens, float noise)
    assert sum((s.token_logprobs for s in streamed), []) == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert sum((s.text_offset for s in streamed), []) == lp.text_offset
    plain = client.completions.create(model="llama", prompt="log me", logprobs=2, extra_body=NO_EOS,
                                      **GREEDY).choices[0].logprobs
    assert plain.token_logprobs == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert all(isinstance(t, str) and t for t in plain.tokens)
    c = client.chat.completions.create(model="llama", messages=CHAT, logprobs=True, top_logprobs=3,
                                       extra_body=NO_EOS, **GREEDY)
    content = c.choices[0].logprobs.content
    assert len(content) == 6
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs),
                                                             reverse=True)
    none = client.chat.completions.create(model="llama", messages=CHAT, extra_body=NO_EOS, **GREEDY)
    assert none.choices[0].logprobs is None


def test_repeated_long_system_prompt_hits_the_prefix_cache(api_server):
    server = api_server(engine={"max_model_len": 256, "num_kv_blocks": 256})
    client = client_for(server)
    system = {"role": "system", "content": "You are a careful assistant who answers briefly. " * 2}
    first = client.chat.completions.create(model="llama", messages=[system, {"role": "user", "content": "a"}],
                                           extra_body=NO_EOS, **GREEDY)
    second = client.chat.completions.create(model="llama", messages=[system, {"role": "user", "content": "b"}],
                                            extra_body=NO_EOS, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 4 == 0 and cached < second.usage.prompt_tokens  # whole blocks
    # vLLM's dev route clears it again
    status, _, body = post(server, "/reset_prefix_cache", None)
    assert status == 200 and json.loads(body)["num_blocks_reset"] > 0
    again = client.chat.completions.create(model="llama", messages=[system, {"role": "user", "content": "b"}],
                                           extra_body=NO_EOS, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens == 0


def test_echo_prompt_lists_and_token_id_prompts(client):
    r = client.completions.create(model="llama", prompt=["one two", "three"], echo=True,
                                  extra_body=NO_EOS, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text.startswith("one two") and r.choices[1].text.startswith("three")
    ids = client.completions.create(model="llama", prompt="one two", extra_body={**NO_EOS, "return_token_ids": True},
                                    **GREEDY)
    by_ids = client.completions.create(model="llama", prompt=[[5, 6, 7]], extra_body=NO_EOS, **GREEDY)
    assert by_ids.usage.prompt_tokens == 3
    assert r.choices[0].text == "one two" + ids.choices[0].text


def test_greedy_completion_equals_llm_generate(client, tiny_llama):
    prompts = ["The paged cache", "prompt number 0", "a b c d e f g"]
    llm = LLM(tiny_llama, **ENGINE)
    want = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for prompt, out in zip(prompts, want):
        r = client.completions.create(model="llama", prompt=prompt, temperature=0, max_tokens=20,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        assert r.choices[0].token_ids == out.outputs[0].token_ids
        assert r.choices[0].text == out.outputs[0].text
    chat = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    r = client.chat.completions.create(model="llama", messages=CHAT, temperature=0, max_tokens=12,
                                       extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].token_ids == chat.outputs[0].token_ids
    assert r.usage.prompt_tokens == len(chat.prompt_token_ids)


def test_streamed_text_equals_non_streamed_with_a_stop_string(client):
    kw = dict(model="llama", prompt="prompt number 7", temperature=0, max_tokens=20, stop=["A7"],
              extra_body=NO_EOS)
    whole = client.completions.create(**kw)
    assert whole.choices[0].finish_reason == "stop" and whole.choices[0].stop_reason == "A7"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == whole.choices[0].text

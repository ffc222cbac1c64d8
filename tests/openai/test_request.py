"""Request bodies → ApiRequest: every accepted field maps where it should; every bad one
is a 400 that names it."""

import pytest

from engine.openai.errors import ApiError
from engine.openai.request import Endpoint, ParseLimits, check_model, parse_chat, parse_completion


def _err(fn, body, **kw) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(body, **kw)
    return e.value


def test_completion_fields_map_to_sampling_params():
    r = parse_completion({
        "model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0, "top_p": 0.5,
        "top_k": -1, "min_p": 0.1, "min_tokens": 2, "seed": 9, "n": 3, "stop": "\n",
        "stop_token_ids": [5], "ignore_eos": True, "logprobs": 2, "stream": True,
        "stream_options": {"include_usage": True}, "user": "u",
        "repetition_penalty": 1.0, "frequency_penalty": 0, "priority": 0, "return_token_ids": True})
    p = r.params
    assert r.endpoint is Endpoint.COMPLETIONS and r.model == "m" and r.prompts == ("hi",)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.min_tokens, p.seed, p.n) == \
        (7, 0.0, 0.5, 0, 0.1, 2, 9, 3)
    assert p.stop == ["\n"] and p.stop_token_ids == [5] and p.ignore_eos and p.logprobs == 2
    assert r.stream and r.include_usage and r.logprobs == 2 and not r.echo and r.return_token_ids
    assert r.num_requests == 1


def test_completion_defaults_and_prompt_forms():
    r = parse_completion({"prompt": "x", "max_tokens": None, "temperature": None})
    assert r.params.max_tokens == 16 and r.params.temperature == 1.0 and r.params.n == 1
    assert r.model is None and r.logprobs is None and not r.stream and not r.include_usage
    assert parse_completion({"prompt": [1, 2, 3]}).prompts == ([1, 2, 3],)
    assert parse_completion({"prompt": ["a", "b"]}).prompts == ("a", "b")
    two = parse_completion({"prompt": [[1, 2], [3]]})
    assert two.prompts == ([1, 2], [3]) and two.num_requests == 2


def test_chat_fields():
    r = parse_chat({"messages": [{"role": "system", "content": "s"},
                                 {"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}],
                    "max_completion_tokens": 5, "max_tokens": 99, "logprobs": True,
                    "top_logprobs": 3, "tools": [], "response_format": {"type": "text"}})
    assert r.endpoint is Endpoint.CHAT and r.messages[1] == {"role": "user", "content": "a\nb"}
    assert r.params.max_tokens == 5 and r.logprobs == 3 and r.params.logprobs == 3
    plain = parse_chat({"messages": [{"role": "user", "content": "x"}]})
    assert plain.params.max_tokens is None and plain.logprobs is None  # up to max_model_len
    assert parse_chat({"messages": [{"role": "user", "content": "x"}],
                       "logprobs": True}).logprobs == 0
    assert parse_chat({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}).params.max_tokens == 4


@pytest.mark.parametrize("body, param", [
    ([1, 2], None),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "temperature": float("inf")}, "temperature"),
    ({"prompt": "x", "top_p": float("nan")}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 65}, "n"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "seed": 1 << 64}, "seed"),
    ({"prompt": "x", "stop": ["ok", ""]}, "stop"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": "big"}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [5]}, "logit_bias"),
    ({"prompt": "x", "allowed_token_ids": []}, "allowed_token_ids"),
    ({"prompt": "x", "allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"prompt": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"prompt": "x", "truncation_side": "middle"}, "truncation_side"),
    ({"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": "yes"}},
     "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": {"chunk_size": 3}}, "stream_options"),
    ({"prompt": "x", "structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ({"prompt": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"prompt": "x", "bad_words": ["no"]}, "bad_words"),
    ({"prompt": "x", "add_special_tokens": False}, "add_special_tokens"),
    ({"prompt": "x", "unknown_vllm_extra": {"x": 1}}, "unknown_vllm_extra"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options"),
    ({"prompt": "x", "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": "x", "suffix": "end"}, "suffix"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": ["a"] * 65}, "prompt"),
])
def test_bad_completion_fields_are_400_naming_the_field(body, param):
    err = _err(parse_completion, body)
    assert err.status == 400 and err.param == param and err.message
    assert err.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
])
def test_bad_chat_fields_are_400(body, param):
    err = _err(parse_chat, body)
    assert err.status == 400 and err.param == param


def test_limits_and_model_check():
    assert _err(parse_completion, {"prompt": "x", "n": 3}, limits=ParseLimits(max_n=2)).param == "n"
    check_model(None, ("llama",))
    check_model("alias", ("llama", "alias"))
    err = _err(lambda b: check_model(b, ("llama",)), "gpt-4")
    assert err.status == 404 and err.code == "model_not_found" and err.param == "model"
    assert "llama" in err.message
    assert err.body() == {"error": {"message": err.message, "type": "invalid_request_error",
                                    "param": "model", "code": "model_not_found"}}


def test_vllm_extras_map_to_sampling_params():
    r = parse_completion({"prompt": "x", "logprobs": 1, "echo": True, "max_tokens": 0,
                          "logit_bias": {"5": 250, "7": -3}, "allowed_token_ids": [5, 7],
                          "truncate_prompt_tokens": 3, "truncation_side": "right", "model": "",
                          "stream": True, "stream_options": {"include_usage": True,
                                                             "continuous_usage_stats": True}})
    p = r.params
    # echo with logprobs asks for the prompt's logprobs; max_tokens 0 generates one token
    # and answers with the prompt alone (vLLM's echo_without_generation)
    assert p.prompt_logprobs == 1 and p.max_tokens == 1 and r.echo_only
    assert p.logit_bias == {5: 100.0, 7: -3.0} and p.allowed_token_ids == [5, 7]  # clamped as vLLM
    assert (r.truncate, r.truncation_side, r.model) == (3, "right", None)
    assert r.include_usage and r.continuous_usage
    # continuous_usage_stats counts only with include_usage, as vLLM's should_include_usage
    assert not parse_completion({"prompt": "x", "stream": True, "stream_options": {
        "continuous_usage_stats": True}}).continuous_usage
    assert parse_completion({"prompt": "x", "prompt_logprobs": 0}).params.prompt_logprobs == 0
    chat = parse_chat({"messages": [{"role": "developer", "content": "d"}], "prompt_logprobs": 2,
                       "include_reasoning": False, "tool_choice": "none"})
    assert chat.params.prompt_logprobs == 2 and chat.messages[0]["role"] == "developer"
    assert _err(parse_chat, {"messages": [{"role": "user", "content": "x"}],
                             "structured_outputs": {"json": {}}}).param == "structured_outputs"

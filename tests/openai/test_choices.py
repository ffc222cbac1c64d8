"""The Assembler turns RequestOutputs into OpenAI chunks and bodies, exactly."""

from engine.openai.choices import Assembler, Update
from engine.openai.request import parse_chat, parse_completion
from engine.openai.token_strings import TokenStrings
from engine.outputs import CompletionOutput, RequestOutput

NO_TOKENIZER = TokenStrings(None)


def _out(rid, samples, finished=False, cached=0, deltas=None, prompt_len=3):
    """samples: {index: (text, token_ids, finish_reason, stop_reason, logprobs)}"""
    outs = [CompletionOutput(k, t, list(ids), fr, sr, lp) for k, (t, ids, fr, sr, lp) in samples.items()]
    return RequestOutput(rid, "p", list(range(prompt_len)), outs, finished, cached, None, deltas or {})


def _asm(req, rids=("r",)):
    return Assembler(req, list(rids), "resp-1", "m", 123, NO_TOKENIZER)


def test_chat_stream_role_first_content_then_finish_on_the_last_piece_and_usage():
    req = parse_chat({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                      "stream_options": {"include_usage": True}})
    a = _asm(req)
    head = {"id": "resp-1", "object": "chat.completion.chunk", "created": 123, "model": "m"}
    # vLLM 0.32's chunk shapes: the role chunk has no token_ids, stop_reason only at the finish
    assert a.opening() == [{**head, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}]
    # a token that is half a character: no chunk until its text exists
    assert a.chunks(Update(_out("r", {0: ("", [200], None, None, None)}), {0: ("", [200])})) == []
    assert a.chunks(Update(_out("r", {0: ("é", [200, 201], None, None, None)}), {0: ("é", [201])})) == [
        {**head, "choices": [{"index": 0, "delta": {"content": "é"}, "logprobs": None,
                              "finish_reason": None, "token_ids": None}]}]
    last = _out("r", {0: ("é!", [200, 201, 5, 2], "stop", 2, None)}, finished=True, cached=4)
    assert a.chunks(Update(last, {0: ("!", [5, 2])})) == [
        {**head, "choices": [{"index": 0, "delta": {"content": "!"}, "logprobs": None,
                              "finish_reason": "stop", "token_ids": None,
                              "stop_reason": None}]}]  # EOS: null
    assert a.done
    assert a.usage_chunk() == {**head, "choices": [], "usage": {
        "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 4, "created_cache_tokens": 0}},
        "system_fingerprint": "kvscope"}


def test_completions_n2_interleave_by_index_and_stop_reasons():
    req = parse_completion({"prompt": "p", "n": 2, "stream": True, "stop": ["."],
                            "stop_token_ids": [9]})
    a = _asm(req)
    assert a.opening() == []
    up = Update(_out("r", {0: ("a", [1], None, None, None), 1: ("b", [2], None, None, None)}),
                {1: ("b", [2]), 0: ("a", [1])})
    assert [c["choices"][0]["index"] for c in a.chunks(up)] == [0, 1]
    fin = _out("r", {0: ("a", [1, 3], "stop", ".", None), 1: ("bc", [2, 9], "stop", 9, None)}, True)
    got = a.chunks(Update(fin, {0: ("", [3]), 1: ("c", [9])}))
    assert [c["choices"][0] for c in got] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "stop_reason": ".",
         "prompt_token_ids": None, "token_ids": None},
        {"index": 1, "text": "c", "logprobs": None, "finish_reason": "stop", "stop_reason": 9,
         "prompt_token_ids": None, "token_ids": None}]
    body = a.body()
    assert body["object"] == "text_completion" and [c["text"] for c in body["choices"]] == ["a", "bc"]
    assert body["usage"]["completion_tokens"] == 4


def test_two_prompts_number_their_choices_and_echo():
    req = parse_completion({"prompt": ["one", "two"], "n": 2, "echo": True, "max_tokens": 1})
    a = _asm(req, ("r-0", "r-1"))
    for rid, t in (("r-0", "x"), ("r-1", "y")):
        a.note(Update(_out(rid, {0: (t, [1], "length", None, None), 1: (t, [1], "length", None, None)},
                           True, prompt_len=2), {}))
    body = a.body()
    assert [(c["index"], c["text"]) for c in body["choices"]] == \
        [(0, "onex"), (1, "onex"), (2, "twoy"), (3, "twoy")]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0, "created_cache_tokens": None,
                                                       "multimodal_tokens": None},
                             "completion_tokens_details": None}


def test_logprobs_are_sliced_by_tokens_sent():
    req = parse_completion({"prompt": "p", "logprobs": 1, "stream": True})
    a = _asm(req)
    e1, e2 = {7: -0.1, 8: -2.0}, {8: -0.5, 7: -0.9}
    a.chunks(Update(_out("r", {0: ("A", [7], None, None, [e1])}), {0: ("A", [7])}))
    got = a.chunks(Update(_out("r", {0: ("AB", [7, 8], "length", None, [e1, e2])}, True),
                          {0: ("B", [8])}))
    lp = got[0]["choices"][0]["logprobs"]
    assert lp == {"text_offset": [len("token_id:7")], "token_logprobs": [-0.5],
                  "tokens": ["token_id:8"], "top_logprobs": [{"token_id:8": -0.5}]}
    chat = _asm(parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                            "top_logprobs": 2}))
    chat.note(Update(_out("r", {0: ("AB", [7, 8], "length", None, [e1, e2])}, True), {}))
    content = chat.body()["choices"][0]["logprobs"]["content"]
    assert content[1] == {"token": "token_id:8", "logprob": -0.5,
                          "bytes": list(b"token_id:8"),
                          "top_logprobs": [{"token": "token_id:8", "logprob": -0.5, "bytes": list(b"token_id:8")},
                                           {"token": "token_id:7", "logprob": -0.9, "bytes": list(b"token_id:7")}]}


def test_abort_finishes_every_open_choice():
    req = parse_chat({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": True})
    a = _asm(req)
    got = a.chunks(Update(_out("r", {0: ("a", [1], "abort", None, None), 1: ("", [], "abort", None, None)},
                               True), {0: ("a", [1])}))
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"], c["choices"][0]["finish_reason"])
            for c in got] == [(0, {"content": "a"}, "abort"), (1, {"content": ""}, "abort")]


def test_chat_echo_prepends_the_last_assistant_message():
    msgs = [{"role": "user", "content": "finish this"}, {"role": "assistant", "content": "Once"}]
    a = _asm(parse_chat({"messages": msgs, "echo": True, "stream": True}))
    opening = a.opening()
    assert [c["choices"][0]["delta"] for c in opening] == [{"role": "assistant", "content": ""},
                                                            {"content": "Once"}]
    a.note(Update(_out("r", {0: (" upon", [1], "length", None, None)}, True), {}))
    assert a.body()["choices"][0]["message"]["content"] == "Once upon"
    user_last = _asm(parse_chat({"messages": msgs[:1], "echo": True}))
    user_last.note(Update(_out("r", {0: ("x", [1], "length", None, None)}, True), {}))
    assert user_last.body()["choices"][0]["message"]["content"] == "x"  # echo only a prefill

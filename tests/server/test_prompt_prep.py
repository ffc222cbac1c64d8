"""Issue 17 item 4, prompts: judged by size before tokenizing, tokenized off the engine
thread (so a big prompt never stalls other clients' steps), and counted against the
connection's in-flight limit while they are handled.

On main at 7416b2c the engine thread tokenized every prompt (a 1 MB one: 0.7 s on
SmolLM2, 14 s for another client's request under a stream of them), a prompt was
judged only after tokenizing, and only accepted requests counted as in flight."""

from __future__ import annotations

import json
import threading
import time

from engine.client import KVScopeClient
from tests.server.helpers import GREEDY, raw, recv_until, send

LONG = {"temperature": 0.0, "max_tokens": 40, "ignore_eos": True}


def _answer(ws, rid: str, timeout: float = 20.0) -> dict:
    return recv_until(ws, lambda m: m.get("request_id") == rid and m["type"] in ("error", "finished"),
                      timeout)[0]


def _spy(tokenizer, gate: threading.Event | None = None, word: str = "") -> list[str]:
    """Record the thread of every ``encode`` of ``tokenizer``; with ``gate``, an encode of
    a text holding ``word`` waits for it (a slow tokenization, deterministic)."""
    encode, threads = tokenizer.encode, []

    def spying(text, *args, **kwargs):
        threads.append(threading.current_thread().name)
        if gate is not None and word in text:
            assert gate.wait(30)
        return encode(text, *args, **kwargs)

    tokenizer.encode = spying
    return threads


def test_prompts_are_judged_by_bytes_first_and_tokenized_off_the_engine_thread(make_server):
    server = make_server()
    with KVScopeClient(server.url, timeout=30) as c:
        c.generate("warm", params=GREEDY)  # the run's PromptPrep has reached the hub
        prep = server.hub.prep
        # the tiny tokenizer's longest token is 13 bytes ('<|endoftext|>'): no text of
        # more than 64 * 13 bytes can fit in max_model_len=64
        assert (prep.max_token_bytes, prep.max_prompt_bytes) == (13, 832)
        engine_calls = _spy(server.worker.engine.tokenizer)
        prep_calls = _spy(prep.tokenizer)
        ws = raw(server.url)
        send(ws, type="submit", prompt="x" * 833, params=GREEDY, request_id="big")
        err = _answer(ws, "big")
        assert (err["type"], err["code"], err["op"]) == ("error", "prompt_too_large", "submit")
        assert "833 bytes" in err["message"] and prep_calls == []  # refused untokenized
        send(ws, type="submit", prompt="x" * 832, params=GREEDY, request_id="long")
        assert _answer(ws, "long")["code"] == "prompt_too_long"  # tokenized, then counted
        send(ws, type="submit", prompt="text", params=GREEDY, request_id="text")
        send(ws, type="submit", messages=[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "hi"}],
             params=GREEDY, request_id="chat")
        assert _answer(ws, "text")["outputs"][0]["finish_reason"] == "length"
        assert _answer(ws, "chat")["outputs"][0]["finish_reason"] == "length"
        assert engine_calls == []  # the engine thread tokenized none of them
        assert set(prep_calls) <= {"kvscope-prep_0", "kvscope-prep_1"} and len(prep_calls) == 3
        # a chat's role must be one the template knows (this one has no tool role)
        for role in ("tool", "robot"):
            send(ws, type="submit", messages=[{"role": role, "content": "x"}], request_id=role)
            err = _answer(ws, role)
            assert err["code"] == "bad_request" and repr(role) in err["message"]
        ws.close()


def test_a_slow_prompt_stalls_nobody_and_counts_as_in_flight(make_server):
    server = make_server(max_in_flight_per_conn=2)
    with KVScopeClient(server.url, timeout=30) as other:
        other.generate("warm", params=GREEDY)
        gate = threading.Event()
        _spy(server.hub.prep.tokenizer, gate, "slow")
        ws = raw(server.url)
        send(ws, type="submit", prompt="a slow prompt", params=LONG, request_id="slow")
        send(ws, type="abort", request_id="slow")  # must not overtake its submit
        send(ws, type="submit", prompt="second", params=LONG, request_id="second")
        send(ws, type="submit", prompt="third", params=LONG, request_id="third")
        # two in flight (one still being tokenized): the third is refused at once
        err = _answer(ws, "third")
        assert (err["code"], err["op"]) == ("too_many_in_flight", "submit")
        # meanwhile another client is served: the tokenization holds no one's steps
        for i in range(3):
            assert other.generate(f"meanwhile {i}", params=GREEDY).outputs[0]["finish_reason"] == "length"
        assert not gate.is_set()
        gate.set()
        # in order: the slow submit is accepted, then aborted by the abort sent after it
        assert _answer(ws, "slow")["outputs"][0]["finish_reason"] == "abort"
        assert _answer(ws, "second")["outputs"][0]["finish_reason"] == "length"
        # and once those finished the connection may submit again
        send(ws, type="submit", prompt="again", params=GREEDY, request_id="again")
        assert _answer(ws, "again")["outputs"][0]["finish_reason"] == "length"
        ws.close()


def test_prep_bounds_follow_the_tokenizer_and_the_template(tiny_llama):
    import pytest

    from engine.protocol import Submit
    from engine.protocol.errors import ProtocolError
    from engine.server.worker.prompt_prep import PromptPrep, longest_token_bytes
    from engine.tokenizer import Tokenizer

    tok = Tokenizer(tiny_llama)  # the serving process's (no transformers model side, no torch)
    assert longest_token_bytes(tok) == len("<|endoftext|>".encode())
    prep = PromptPrep(tok, 288, 16)
    assert prep.roles == ("system", "developer", "user", "assistant") and prep.max_prompt_bytes == 16 * 13
    # what the bound rests on: text made of the longest token is one token per 13 bytes,
    # the fewest tokens any text of that many bytes can be
    assert len(tok.encode("<|endoftext|>" * 15)) == 15
    with pytest.raises(ProtocolError) as refused:
        prep.prepare(Submit(prompt="y" * (16 * 13 + 1), request_id="r"))
    assert (refused.value.code, refused.value.request_id) == ("prompt_too_large", "r")
    # a multi-byte character counts its UTF-8 bytes, not one
    with pytest.raises(ProtocolError, match="210 bytes"):
        prep.prepare(Submit(prompt="é" * 105))
    done = prep.prepare(Submit(prompt=[5, 6, 7]))
    assert (done.text, done.token_ids) == (None, [5, 6, 7])
    with pytest.raises(ProtocolError, match="out of the vocabulary"):
        prep.prepare(Submit(prompt=[5, 288]))
    tok.chat_template = "{% for m in messages %}{% if m.role == 'tool' %}T{% endif %}{{ m.content }}{% endfor %}"
    tool = PromptPrep(tok, 288, 16)
    assert tool.roles[-1] == "tool"
    chat = tool.prepare(Submit(messages=[{"role": "tool", "content": "ok"}]))
    assert chat.text == "Tok" and chat.token_ids == tok.encode("Tok", add_special_tokens=False)

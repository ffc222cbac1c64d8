"""Every error class in OpenAI's shape and status, and the server serves on after each."""

import json
import threading
import time

import openai
import pytest

from tests.openai.conftest import GREEDY, NO_EOS, Gate, client_for, post
from tests.tiny_models import VOCAB_SIZE

TOKEN = "a-long-enough-test-token-0123456789"
CHAT = [{"role": "user", "content": "hi"}]


def _body(exc: openai.APIStatusError) -> dict:
    err = exc.body if "message" in (exc.body or {}) else exc.body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _still_serves(client) -> None:
    r = client.completions.create(model="llama", prompt="still up", extra_body=NO_EOS, **GREEDY)
    assert r.choices[0].finish_reason == "length"


def test_bad_parameters_are_400_naming_the_parameter(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt="x", temperature=-1)
    err = _body(e.value)
    assert err["param"] == "temperature" and err["type"] == "invalid_request_error"
    assert err["code"] == "invalid_value" and "temperature" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama", messages=CHAT, top_logprobs=2)
    assert _body(e.value)["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:  # token ids outside the vocabulary
        client.completions.create(model="llama", prompt=[1, 99999])
    assert "vocabulary" in _body(e.value)["message"]
    # top_k is checked against the vocabulary at admission (SamplingParams' own check,
    # the same as for a websocket submit), and still names the parameter
    vocab = VOCAB_SIZE
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt="x", extra_body={"top_k": 1 << 63})
    err = _body(e.value)
    assert err["param"] == "top_k" and err["code"] == "invalid_value"
    assert f"vocabulary size ({vocab})" in err["message"]
    # a chat of empty messages has nothing to generate from: the protocol's own refusal
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama", messages=[{"role": "user", "content": " "}])
    err = _body(e.value)
    assert err["code"] == "empty_prompt" and "empty" in err["message"]
    _still_serves(client)


def test_prompt_longer_than_max_model_len_says_by_how_much(client):
    # vLLM's sentence word for word (clients parse it), plus by how much
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt="x" * 70)
    err = _body(e.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "input_tokens"
    assert err["message"] == (
        "This model's maximum context length is 64 tokens. However, your request has 70 input "
        "tokens. Please reduce the length of the input messages. It is 7 tokens too long: room "
        "is needed for at least one generated token. (parameter=input_tokens, value=70)")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "y" * 80}])
    assert "However, your request has" in _body(e.value)["message"]
    # one prompt of a list too long: the others are not left running
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="llama", prompt=["fine", "x" * 70], max_tokens=40,
                                  extra_body=NO_EOS)
    _still_serves(client)


def test_max_tokens_past_the_context_is_400_in_vllms_words(client):
    # 10 prompt tokens + 60 > 64: vLLM refuses an explicit budget that cannot fit
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt=list(range(3, 13)), max_tokens=60)
    err = _body(e.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert err["message"] == (
        "'max_tokens' or 'max_completion_tokens' is too large: 60. This model's maximum context "
        "length is 64 tokens and your request has 10 input tokens (60 > 64 - 10). "
        "(parameter=max_tokens, value=60)")
    # chat's max_completion_tokens is the same budget
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama", messages=CHAT, max_completion_tokens=64)
    assert _body(e.value)["param"] == "max_tokens"
    # exactly filling the context is fine, and so is no budget at all (chat): the engine
    # stops at max_model_len with "length", as vLLM clamps an absent max_tokens
    r = client.completions.create(model="llama", prompt=list(range(3, 13)), max_tokens=54,
                                  extra_body=NO_EOS, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 54
    r = client.chat.completions.create(model="llama", messages=CHAT, extra_body=NO_EOS,
                                       temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 64
    _still_serves(client)


def test_negative_seeds_are_accepted_as_vllm_does(client):
    # vLLM takes any int64 seed; -1 seeds the generator as 2**64 - 1 does (torch's rule)
    kw = dict(model="llama", prompt="seed", max_tokens=6, temperature=1.0, extra_body=NO_EOS)
    a = client.completions.create(seed=-1, **kw).choices[0].text
    assert client.completions.create(seed=2**64 - 1, **kw).choices[0].text == a
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(seed=-2**63 - 1, **kw)
    assert _body(e.value)["param"] == "seed"


def test_prompts_are_prepared_off_the_engine_thread(server, client):
    # As for a websocket submit: PromptPrep checks and tokenizes in the hub's worker pool
    # and the engine thread only enters the Prepared request (it prepares plain Submits).
    deadline = time.monotonic() + 10  # ready is set on the engine thread just before the
    while server.hub.prep is None:    # run's NewRun (which carries the PromptPrep) reaches the loop
        assert time.monotonic() < deadline
        time.sleep(0.01)
    prep = server.hub.prep
    seen: list[str] = []
    real = prep.tokenized  # prepare (websocket) and the API's preparation both call it

    def spy(op):
        seen.append(threading.current_thread().name)
        return real(op)

    prep.tokenized = spy
    client.completions.create(model="llama", prompt=["one", "two"], extra_body=NO_EOS, **GREEDY)
    client.chat.completions.create(model="llama", messages=CHAT, extra_body=NO_EOS, **GREEDY)
    assert len(seen) == 3 and all(name.startswith("kvscope-prep") for name in seen), seen
    # its refusals, before any tokenizing: more bytes than any prompt that fits, a role
    # the chat template does not know
    too_big = "x" * (prep.max_prompt_bytes + 1)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llama", prompt=too_big)
    err = _body(e.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert f"{len(too_big)} bytes" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="llama", messages=[{"role": "robot", "content": "hi"}])
    assert "'robot'" in _body(e.value)["message"]
    _still_serves(client)


def test_unknown_model_is_404(client, tiny_llama):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    err = _body(e.value)
    assert err["code"] == "model_not_found" and err["param"] == "model" and "'llama'" in err["message"]
    # with --served-model-name, those are the only names (as in vLLM): not the --model path
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=tiny_llama, prompt="x", extra_body=NO_EOS, **GREEDY)
    _still_serves(client)


def test_served_model_names_name_the_api_and_the_metrics(make_server, tiny_llama):
    # without --served-model-name the API answers to --model, as vLLM does
    plain = make_server()
    with client_for(plain) as c:
        assert [m.id for m in c.models.list().data] == [tiny_llama]
        r = c.completions.create(model=tiny_llama, prompt="by path", extra_body=NO_EOS, **GREEDY)
        assert r.model == tiny_llama
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="llama", prompt="x", **GREEDY)
    # several names: all listed and accepted; the first answers for a call without a model
    # and labels the Prometheus series, so the API and the dashboards agree
    named = make_server(served_model_name=("tiny", "tiny-alias"))
    with client_for(named) as c:
        assert [m.id for m in c.models.list().data] == ["tiny", "tiny-alias"]
        assert c.completions.create(model="tiny-alias", prompt="b", extra_body=NO_EOS,
                                    **GREEDY).model == "tiny-alias"
    status, _, raw = post(named, "/v1/completions", {"prompt": "no model", "max_tokens": 2})
    assert status == 200 and json.loads(raw)["model"] == "tiny"
    status, _, metrics = post(named, "/metrics", None, method="GET")
    assert status == 200 and 'model_name="tiny"' in metrics.decode()
    assert 'model_name="tiny-alias"' not in metrics.decode()
    status, _, health = post(named, "/healthz", None, method="GET")
    assert json.loads(health)["served_model_name"] == "tiny"  # what the Submit page's snippet uses


def test_token_required_as_bearer_when_set(api_server):
    server = api_server(token=TOKEN)
    for key in ("none", "wrong-token"):
        with client_for(server, api_key=key) as c, pytest.raises(openai.AuthenticationError) as e:
            c.models.list()
        assert _body(e.value)["code"] == "invalid_api_key"
        with client_for(server, api_key=key) as c, pytest.raises(openai.AuthenticationError):
            c.completions.create(model="llama", prompt="x")
    status, headers, _ = post(server, "/v1/chat/completions", {"messages": CHAT})
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    with client_for(server, api_key=TOKEN) as c:
        _still_serves(c)


def test_loading_is_503(api_server):
    gate = Gate()
    server = api_server(ready=False, engine_factory=gate)
    with client_for(server) as c:
        for call in (lambda: c.models.list(),
                     lambda: c.completions.create(model="llama", prompt="x")):
            with pytest.raises(openai.InternalServerError) as e:
                call()
            assert e.value.status_code == 503 and _body(e.value)["code"] == "loading"
        gate.open()
        assert server.wait_ready(60).status.value == "ready"
        _still_serves(c)


def test_full_waiting_queue_is_429(api_server):
    # One sequence runs, one waits; a third request finds the queue full.
    server = api_server(engine={"max_num_seqs": 1, "max_waiting": 1})
    c = client_for(server)
    long = dict(model="llama", prompt="busy", temperature=0, max_tokens=50, stream=True,
                extra_body=NO_EOS)
    streams = [c.completions.create(**long) for _ in range(2)]  # both accepted: streams started
    with pytest.raises(openai.RateLimitError) as e:
        c.completions.create(model="llama", prompt="one too many")
    err = _body(e.value)
    assert err["code"] == "queue_full" and err["type"] == "rate_limit_error"
    for s in streams:
        s.close()  # gone: their requests are aborted (as soon as the server sees it)
    deadline = time.monotonic() + 20
    while True:
        try:
            return _still_serves(c)
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the closed streams' requests were never aborted"
            time.sleep(0.05)


def test_http_level_errors(api_server):
    server = api_server(max_frame_bytes=4096)
    status, _, body = post(server, "/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(body)["error"]["message"]
    status, _, body = post(server, "/v1/completions", {"prompt": "y" * 5000})
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    status, _, body = post(server, "/v1/completions", None, method="GET")
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    status, _, body = post(server, "/v1/embeddings", {"input": "x"})
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, _, body = post(server, "/elsewhere", None, method="GET")
    assert status == 404 and json.loads(body)["error"] == "not_found"  # the server's own shape
    # a browser page of another site may not drive the engine; one of this machine may
    evil = {"Origin": "https://evil.example"}
    status, _, body = post(server, "/v1/completions", {"prompt": "x"}, evil)
    assert status == 403 and json.loads(body)["error"]["code"] == "origin_not_allowed"
    ok = {"Origin": "http://localhost:8501"}
    status, _, _ = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2}, ok)
    assert status == 200


def test_many_bad_clients_do_not_stop_others(api_server):
    server = api_server()
    c = client_for(server)
    bad = [{"prompt": "x", "temperature": "hot"}, {"prompt": [[1], []]}, {"messages": "no"},
           {"prompt": "x", "n": 10**6}, {"prompt": "x", "seed": 10**30}, {"prompt": "x" * 100},
           {"prompt": "x", "top_k": 10**30}, b'{"prompt": "x", "temperature": Infinity}']
    errors = []

    def hammer():
        for body in bad * 3:
            errors.append(post(server, "/v1/completions", body)[0])

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    _still_serves(c)
    for t in threads:
        t.join(60)
    assert set(errors) == {400} and len(errors) == 4 * 3 * len(bad)
    _still_serves(c)

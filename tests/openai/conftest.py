"""Live servers for the API tests (the server tests' fixtures: a KVScopeServer on the tiny
Llama on a free port, recording into the test's own SQLite file), and OpenAI clients."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import ENGINE, Gate, db_path, make_server, tiny_llama  # noqa: F401

GREEDY = {"temperature": 0.0, "max_tokens": 6}
NO_EOS = {"ignore_eos": True}  # random weights may say EOS at once; pass as extra_body


def client_for(server, api_key: str = "unused", **kw) -> openai.OpenAI:
    # max_retries=0: the SDK retries 429/5xx by default, and the tests want to see them
    return openai.OpenAI(base_url=server.http_url, api_key=api_key, max_retries=0,
                         timeout=kw.pop("timeout", 60), **kw)


SERVED = "llama"  # the API tests' --served-model-name (their --model is the tiny model's path)


@pytest.fixture
def api_server(make_server):
    """``make_server``, with the tiny Llama served as "llama" (vLLM's --served-model-name)."""
    def make(**kw):
        kw.setdefault("served_model_name", (SERVED,))
        return make_server(**kw)

    return make


@pytest.fixture
def server(api_server):
    return api_server()


@pytest.fixture
def client(server) -> openai.OpenAI:
    with client_for(server) as c:
        yield c


def post(server, path: str, body, headers: dict | None = None, method: str = "POST"):
    """A raw HTTP call (no client logic): (status, headers, body bytes)."""
    import json
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()

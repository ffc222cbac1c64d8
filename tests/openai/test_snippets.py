"""The copy-paste snippets (Submit page, README) run as printed against a live server."""

import json
import shutil
import subprocess

import pytest

from engine.openai.snippets import curl_snippet, python_snippet
from tests.openai.test_errors import TOKEN


def test_python_snippet_runs(api_server, capsys, monkeypatch):
    # the snippet asks for 64 tokens after its prompt: more context than the tests' 64
    server = api_server(token=TOKEN, engine={"max_model_len": 128})
    monkeypatch.setenv("KVSCOPE_TOKEN", TOKEN)
    exec(compile(python_snippet(server.http_url, "llama", token=True), "<snippet>", "exec"), {})
    out = capsys.readouterr().out
    assert "cached prompt tokens: 0" in out
    assert 'api_key="unused"' in python_snippet(server.http_url, "llama")


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_curl_snippet_runs(api_server, monkeypatch):
    server = api_server(token=TOKEN)
    monkeypatch.setenv("KVSCOPE_TOKEN", TOKEN)
    res = subprocess.run(["bash", "-c", curl_snippet(server.http_url, "llama", token=True)],
                         capture_output=True, text=True, timeout=60)
    body = json.loads(res.stdout)
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] >= 1


def test_readme_shows_the_snippets_as_generated():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    url = "http://127.0.0.1:8765/v1"
    assert python_snippet(url, "smollm2-135m") in readme
    assert curl_snippet(url, "smollm2-135m") in readme

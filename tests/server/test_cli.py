"""`kvscope submit` streams the answer and prints the request's cache figures."""

import json

from engine.cli import main as cli_main


def test_submit_prints_text_and_cache_figures(make_server, capsys):
    server = make_server()
    args = ["submit", "the same words", "--url", server.url, "--max-tokens", "5"]
    assert cli_main(args) == 0
    first = capsys.readouterr().out
    assert "finish=" in first and "cached_tokens=0" in first and "ttft=" in first
    assert cli_main(args) == 0  # the prompt's full blocks are now cached
    second = capsys.readouterr().out
    assert "cached_tokens=0" not in second
    assert cli_main(args[:4] + ["--chat", "--n", "2", "--temperature", "1", "--seed", "1",
                                "--json"]) == 0
    fin = json.loads(capsys.readouterr().out)
    assert fin["type"] == "finished" and len(fin["outputs"]) == 2


def test_submit_reports_errors(make_server, capsys):
    server = make_server()
    assert cli_main(["submit", "x", "--url", server.url, "--temperature", "-1"]) == 1
    assert "bad_params" in capsys.readouterr().err

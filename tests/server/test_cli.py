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


def test_submit_n2_samples_by_default_and_heads_every_sample(make_server, capsys):
    """The README's `kvscope submit "…" --n 2`: without --temperature, n > 1 samples at 1.0
    (greedy samples would all be the same) and each sample, 0 included, has a header."""
    server = make_server()
    base = ["submit", "Tell me a story about the sea", "--url", server.url, "--max-tokens", "12",
            "--seed", "3"]
    assert cli_main(base + ["--n", "2", "--json"]) == 0
    fin = json.loads(capsys.readouterr().out)
    texts = [o["token_ids"] for o in fin["outputs"]]
    assert len(texts) == 2 and texts[0] != texts[1]  # sampled, not greedy
    assert cli_main(base + ["--n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("--- sample 0\n") and "\n--- sample 1\n" in out
    assert cli_main(base + ["--n", "2", "--temperature", "0", "--json"]) == 0
    greedy = json.loads(capsys.readouterr().out)["outputs"]
    assert greedy[0]["token_ids"] == greedy[1]["token_ids"]  # what an explicit 0 asks for
    assert cli_main(base + ["--json"]) == 0  # one sample stays greedy by default
    one = json.loads(capsys.readouterr().out)["outputs"]
    assert cli_main(base + ["--json", "--temperature", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"][0]["token_ids"] == one[0]["token_ids"]
    assert "1.0 when --n > 1" in " ".join(_help(["submit", "--help"]).split())


def _help(argv):
    import contextlib
    import io

    import pytest

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        cli_main(argv)
    return buf.getvalue()

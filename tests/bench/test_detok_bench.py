"""Smoke test of ``python -m bench.detok`` on the tiny tokenizer: the figures are there
and every text agrees. Timings are not checked (shared CI machine)."""

from transformers import AutoTokenizer

from bench.detok import main, measure


def test_detok_bench_measures_both_methods_and_the_texts_agree(tiny_llama):
    r = measure(AutoTokenizer.from_pretrained(tiny_llama), num_tokens=300, repeats=1)
    assert r["texts_agree"] and r["num_tokens"] == 300 and r["tokens_inside_a_character"] > 0
    for m in r["methods"].values():
        assert 0 < m["early_s"] and 0 < m["late_s"] and m["total_s"] > 0


def test_detok_bench_runs_from_the_command_line(tiny_llama, capsys):
    main(["--tokens", "200", "--repeats", "1", "--model", tiny_llama])
    out = capsys.readouterr().out
    assert "output processor (incremental)" in out and "texts agree" in out and ": True" in out

"""bench/llama_cpp_compare.py's summary line: llama.cpp's best decode over kvscope's best,
per thread count (issue 33's batch-1 goal is <= 1.5x)."""

from __future__ import annotations

from bench.llama_cpp_compare import best_ratios


def _row(system, threads, tok_s):
    return {"system": system, "threads": threads, "prefill_512_s": 1.0, "decode_tok_s": tok_s}


def test_best_against_best_per_thread_count():
    rows = [_row("kvscope int8", 1, 50.0), _row("kvscope w8a8", 1, 60.0), _row("llama.cpp Q4_1 (a)", 1, 90.0),
            _row("llama.cpp Q4_1 (b)", 1, 84.0), _row("kvscope w8a8", 2, 80.0), _row("llama.cpp Q4_1 (a)", 2, 120.0),
            _row("kvscope float32", 4, 10.0)]  # no llama.cpp row at 4 threads: no line
    assert best_ratios(rows) == [
        "1 thread(s): best llama.cpp 90.0 tok/s / best kvscope (kvscope w8a8) 60.0 = 1.50x",
        "2 thread(s): best llama.cpp 120.0 tok/s / best kvscope (kvscope w8a8) 80.0 = 1.50x",
    ]

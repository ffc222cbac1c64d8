"""``kvscope lesson``: --list, a text run, a --json run, and errors."""

import json

from engine.cli import main


def test_list_text_and_json(capsys):
    assert main(["lesson", "--list"]) == 0
    out = capsys.readouterr().out
    assert "1. Why contiguous allocation wastes memory" in out and "8. Sizing the KV budget" in out
    assert main(["lesson", "--list", "--json"]) == 0
    cat = json.loads(capsys.readouterr().out)
    assert [c["number"] for c in cat] == list(range(1, 9))


def test_text_run_prints_questions_answers_pool_and_replay_hint(capsys, tiny_llama, lesson_db):
    assert main(["lesson", "2", "--model", tiny_llama, "--db", lesson_db]) == 0
    out = capsys.readouterr().out
    for text in ("Lesson 2: Blocks and block tables", "Q1.", "answer: 2", "why:",
                 "pool at step", "Takeaway:", "kvscope replay "):
        assert text in out, text


def test_json_run_is_one_document_on_stdout(capsys, tiny_llama, lesson_db):
    assert main(["lesson", "8", "--json", "--model", tiny_llama, "--db", lesson_db]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["number"] == 8 and doc["recorded"]
    assert {q["key"] for q in doc["questions"]} == {"num_blocks", "sequences", "too_small"}
    assert doc["runs"][0]["label"].startswith("lesson 8: KV budget")
    assert doc["pool"]["snapshot"]["num_blocks"] == 10


def test_errors_exit_1_with_a_message(capsys, tiny_llama):
    assert main(["lesson", "9"]) == 1
    assert "no lesson 9" in capsys.readouterr().err
    assert main(["lesson", "2", "--json", "--model", "/no/such/model", "--no-record"]) == 1
    assert "error" in json.loads(capsys.readouterr().out)

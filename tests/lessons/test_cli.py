"""``kvscope lesson``: --list, a text run, a --json run, and errors."""

import json

from engine.cli import main


def test_list_text_and_json(capsys):
    assert main(["lesson", "--list"]) == 0
    out = capsys.readouterr().out
    assert "1. Why contiguous allocation wastes memory" in out and "8. Sizing the KV budget" in out
    assert main(["lesson", "--list", "--json"]) == 0
    cat = json.loads(capsys.readouterr().out)
    assert [c["number"] for c in cat] == list(range(1, 11))


def test_text_run_prints_questions_answers_pool_and_replay_hint(capsys, tiny_llama, lesson_db):
    assert main(["lesson", "2", "--model", tiny_llama, "--db", lesson_db]) == 0
    out = capsys.readouterr().out
    for text in ("Lesson 2: Blocks and block tables", "Q1.", "answer: 2", "why:",
                 "pool at step", "Takeaway:", "kvscope replay "):
        assert text in out, text
    # markdown is rendered for the terminal (capsys is no tty: plain text, no ANSI)
    assert "**" not in out and "`" not in out and "\033[" not in out
    assert "Blocks. The KV pool is an array of physical blocks" in " ".join(out.split())


def test_text_run_hides_engine_info_logs_unless_verbose(capsys, caplog, tiny_llama, lesson_db):
    import logging

    caplog.set_level(logging.INFO)
    assert main(["lesson", "2", "--model", tiny_llama, "--db", lesson_db, "--no-record"]) == 0
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("engine", "kvscope", "lessons")]
    assert [r for r in ours if r.levelno < logging.WARNING] == []
    assert "INFO" not in capsys.readouterr().out
    caplog.clear()
    assert main(["lesson", "2", "--model", tiny_llama, "--no-record", "--verbose"]) == 0
    names = {r.name for r in caplog.records if r.levelno == logging.INFO}
    assert {"engine.engine_core.startup", "kvscope.lessons"} <= names
    assert logging.getLogger("engine").level == logging.NOTSET  # restored after the lesson


def test_markdown_renders_for_the_terminal():
    from lessons.terminal import BOLD_OFF, BOLD_ON, render

    md = "**The KV cache.** A *key* per `max_model_len`;\n- *reservation*: 2 * 3 slots, a*b"
    assert render(md) == "The KV cache. A key per max_model_len;\n- reservation: 2 * 3 slots, a*b"
    assert render(md, ansi=True).startswith(f"{BOLD_ON}The KV cache.{BOLD_OFF} A key")


def test_json_run_is_one_document_on_stdout(capsys, tiny_llama, lesson_db):
    assert main(["lesson", "8", "--json", "--model", tiny_llama, "--db", lesson_db]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["number"] == 8 and doc["recorded"]
    assert {q["key"] for q in doc["questions"]} == {"num_blocks", "sequences", "too_small"}
    assert doc["runs"][0]["label"].startswith("lesson 8: KV budget")
    assert doc["pool"]["snapshot"]["num_blocks"] == 10


def test_errors_exit_1_with_a_message(capsys, tiny_llama):
    assert main(["lesson", "11"]) == 1
    assert "no lesson 11" in capsys.readouterr().err
    assert main(["lesson", "2", "--json", "--model", "/no/such/model", "--no-record"]) == 1
    assert "error" in json.loads(capsys.readouterr().out)

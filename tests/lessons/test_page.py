"""The Lessons page: one whole lesson through AppTest, and no torch in the dashboard."""

import subprocess
import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).with_name("lessons_app.py"))


def _texts(at) -> str:
    return "\n".join([m.value for m in at.markdown] + [c.value for c in at.caption]
                     + [s.value for s in at.success] + [i.value for i in at.info])


def test_page_walks_through_lesson_6(monkeypatch, tiny_llama, tmp_path):
    monkeypatch.setenv("KVSCOPE_LESSON_MODEL", tiny_llama)
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "runs.sqlite"))
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.selectbox(key="lesson_pick").set_value(6).run()
    assert "Parallel sampling" in _texts(at)
    assert at.button(key="lesson_prev").disabled
    at.button(key="lesson_next").click().run()
    assert "Forks share blocks" in _texts(at)
    at.button(key="lesson_prev").click().run()
    assert "Parallel sampling" in _texts(at)
    from lessons import get_lesson

    for _ in range(len(get_lesson(6).sections)):  # the narrative pages, then predict-and-run
        at.button(key="lesson_next").click().run()
    assert at.button(key="lesson_next").disabled
    assert at.text_input(key="lesson_model").value == tiny_llama
    at.radio(key="lesson_6_predict_peak").set_value("the forks use fewer")
    at.number_input(key="lesson_6_predict_copies").set_value(4)  # wrong on purpose
    at.button(key="lesson_run").click().run(timeout=240)
    assert not at.error, [e.value for e in at.error]
    text = _texts(at)
    assert "Computed from the run: **the forks use fewer** (right: you predicted it)" in text
    assert "Computed from the run: **3** (not quite: you predicted 4)" in text
    assert "Takeaway" in text
    assert len(at.get("plotly_chart")) == 3  # two charts and the pool grid
    at.button(key="lesson_6_replay_0").click().run()
    run_id = at.session_state["replay_run"]
    assert run_id.startswith("2") and run_id in _texts(at)  # fallback hint outside the app


def test_page_imports_no_torch():
    code = ("import sys; sys.path.insert(0, '.'); import dashboard.lessons_page; "
            "bad = {'torch', 'transformers', 'engine.model', 'engine.llm', 'engine.llm_engine'}"
            " & set(sys.modules); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_page_runs_lesson_10_and_shows_answers_computed_from_the_run(monkeypatch, tiny_llama, tmp_path):
    monkeypatch.setenv("KVSCOPE_LESSON_MODEL", tiny_llama)
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "runs.sqlite"))
    at = AppTest.from_file(APP, default_timeout=30).run()
    at.selectbox(key="lesson_pick").set_value(10).run()
    assert '"My hit rate is 0%."' in _texts(at) and "vLLM #54607" in _texts(at)
    from lessons import get_lesson

    for _ in range(len(get_lesson(10).sections)):
        at.button(key="lesson_next").click().run()
    at.radio(key="lesson_10_predict_bug").set_value("yes: identical prefixes should hit")  # wrong
    at.number_input(key="lesson_10_predict_turn2").set_value(48)
    at.radio(key="lesson_10_predict_fill").set_value("between 50% and 90%")
    at.button(key="lesson_run").click().run(timeout=240)
    assert not at.error, [e.value for e in at.error]
    text = _texts(at)
    assert ("Computed from the run: **no: the shared prefix is shorter than a block** (not quite: "
            "you predicted yes: identical prefixes should hit)") in text
    assert "Computed from the run: **48** (right: you predicted it)" in text
    assert "Computed from the run: **evicted: cached, then reused for other requests**" in text
    assert "Computed from the run: **between 50% and 90%** (right: you predicted it)" in text
    # bars, lines and the pool grid are plotly; the two tables are dataframes
    assert len(at.get("plotly_chart")) == 3 and len(at.dataframe) == 2
    rows = at.dataframe[1].value.values.tolist()
    assert rows[0] == ["17-token", "100.0%", "53.1%", "53.1%", "50.0% .. 100.0%"]

"""Every page against a real server (tiny model), driven through Streamlit's AppTest.

Each page must render without an exception, and its controls must act: presets and
the prompt form submit and stream, Replay steps and jumps, Compare compares, Engine
restarts the engine (last: it starts a new run).
"""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from engine.store.runs import RunStore

from dashboard.panels import TABS
from tests.dashboard.conftest import APP

pytestmark = pytest.mark.usefixtures("dashboard_env")


def app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=60)


def rerun_until(at: AppTest, pred, timeout: float = 60.0, what: str = "") -> AppTest:
    deadline = time.monotonic() + timeout
    while True:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if pred(at):
            return at
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [t.value for t in at.text])


def test_live_page_draws_the_pool_and_every_tab():
    at = rerun_until(app(), lambda a: any(m.label == "blocks used" for m in a.metric),
                     what="the live view")
    assert len(at.get("plotly_chart")) >= 2  # grid + block tables
    assert any("Step " in c.value for c in at.caption)
    for tab in TABS:
        at.session_state["live_tabs"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])
    at.toggle(key="live_paused").set_value(True).run()
    assert not at.exception
    at.button(key="live_reset").click().run()
    assert not at.exception


def test_submit_prompt_and_preset_stream_outputs():
    at = app().run()
    at.switch_page("views/submit.py")
    rerun_until(at, lambda a: not a.button(key="preset_forks").disabled, what="a live engine")
    at.text_area(key="submit_prompt").set_value("Paged attention")
    at.number_input(key="sp_max_tokens").set_value(6)
    next(b for b in at.button if b.label == "Submit").click()
    rerun_until(at, lambda a: "finished (length)" in texts(a), what="the prompt's output")
    at.radio(key="submit_mode").set_value("Chat").run()
    at.text_area(key="submit_user").set_value("Hi")
    at.slider(key="sp_temperature").set_value(0.8)
    at.number_input(key="sp_top_k").set_value(20)
    at.text_input(key="sp_stop").set_value("x|y")
    next(b for b in at.button if b.label == "Submit").click()
    rerun_until(at, lambda a: texts(a).count("finished") >= 2, what="the chat's output")
    at.button(key="preset_forks").click()
    rerun_until(at, lambda a: "sample 3:" in texts(a) and texts(a).count("finished") >= 2,
                what="four fork samples")


def test_submit_form_refuses_out_of_range_and_empty_inputs_beside_the_field():
    at = app().run()
    at.switch_page("views/submit.py")
    rerun_until(at, lambda a: not a.button(key="preset_forks").disabled, what="a live engine")
    at.number_input(key="sp_max_tokens").set_value(0)
    at.number_input(key="sp_n").set_value(100)
    next(b for b in at.button if b.label == "Submit").click().run()
    errors = [e.value for e in at.error]
    assert any("max_tokens must be a whole number from 1 to" in e for e in errors), errors
    assert any("n must be from 1 to 64" in e for e in errors), errors
    assert "submit_request_ids" not in at.session_state  # nothing was sent
    at.number_input(key="sp_max_tokens").set_value(4)
    at.number_input(key="sp_n").set_value(1)
    at.text_area(key="submit_prompt").set_value("   ")
    next(b for b in at.button if b.label == "Submit").click().run()
    assert [e.value for e in at.error] == ["Write a prompt: it may not be empty."]
    at.radio(key="submit_mode").set_value("Chat").run()
    at.text_input(key="submit_system").set_value("")
    at.text_area(key="submit_user").set_value("")
    next(b for b in at.button if b.label == "Submit").click().run()
    assert any("Write a user message" in e.value for e in at.error)
    at.text_area(key="submit_user").set_value("Hi")
    next(b for b in at.button if b.label == "Submit").click().run()
    assert not at.error  # a good one goes out, and no stale message stays
    rerun_until(at, lambda a: "finished (length)" in texts(a), what="the chat's output")


def test_replay_page_steps_jumps_and_plays(dashboard_env):
    runs = RunStore(dashboard_env.db).list_runs()
    pressure = next(r for r in runs if r["label"] == "fake pool 20 (pressure)")
    at = app().run()
    at.switch_page("views/replay.py").run()
    at.selectbox(key="replay_run").set_value(pressure["id"]).run()
    assert not at.exception
    assert at.session_state["replay_index"] == 0
    for kind in ("eviction", "preemption", "CoW copy"):
        at.session_state["replay_index"] = 0
        at.run()
        at.button(key=f"replay_jump_{kind}").click().run()
        assert not at.exception
        assert at.session_state["replay_index"] > 0, kind
    at.button(key="replay_next").click().run()
    idx = at.session_state["replay_index"]
    at.button(key="replay_play").click().run()  # starts playing: the fragment advances
    assert at.session_state["replay_playing"] and at.session_state["replay_index"] >= idx
    at.button(key="replay_play").click().run()  # pause
    assert not at.session_state["replay_playing"]
    at.slider(key="replay_slider").set_value(3).run()
    assert not at.exception and at.session_state["replay_index"] == 2
    for tab in TABS:
        at.session_state["replay_tabs"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])


def test_compare_page_puts_two_runs_side_by_side(dashboard_env):
    runs = {r["label"]: r["id"] for r in RunStore(dashboard_env.db).list_runs()}
    at = app().run()
    at.switch_page("views/compare.py").run()
    at.selectbox(key="compare_a").set_value(runs["fake pool 20 (pressure)"])
    at.selectbox(key="compare_b").set_value(runs["fake pool 48"]).run()
    assert not at.exception
    figures, settings = at.dataframe[0].value, at.dataframe[1].value
    assert settings.loc[settings["setting"] == "num_blocks", "differs"].item() == "yes"
    assert "preemptions" in set(figures["figure"])
    assert any("`num_blocks` 20 → 48" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 6


def test_simulate_page_sweeps_draws_the_capacity_curve_and_records_runs(dashboard_env):
    at = app().run()
    at.switch_page("views/simulate.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="sim_source").value == "mooncake_conversation_300.jsonl"
    at.multiselect(key="sim_routers").set_value(["round-robin", "oracle"])
    at.checkbox(key="sim_record").check()
    at.button(key="sim_go").click().run(timeout=240)
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert list(table["router"]) == ["round-robin", "oracle"] * 3
    assert (table["prefix_cache_hit_rate"] > 0).all()
    assert len(at.get("plotly_chart")) == 1
    recorded = [r for r in RunStore(dashboard_env.db).list_runs() if r.get("kind") == "simulated"]
    assert len(recorded) == 4 and all(r["num_steps"] > 0 for r in recorded)
    assert any("simulated run" in s.value for s in at.success)
    at.session_state["replay_run"] = recorded[0]["id"]  # Replay says what a simulated run is
    at.switch_page("views/replay.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(c.value.startswith("A simulated run (`kvscope simulate`): pod ") for c in at.caption)


def test_lessons_page_is_in_the_navigation():
    at = app().run()
    at.switch_page("views/lessons.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="lesson_pick").options


def test_replay_lands_on_a_step_handed_over_by_another_page(dashboard_env):
    runs = {r["label"]: r["id"] for r in RunStore(dashboard_env.db).list_runs()}
    at = app().run()
    at.session_state["replay_run"] = runs["fake pool 48"]  # what Lessons' "Open in Replay" sets
    at.session_state["replay_index"] = 5
    at.switch_page("views/replay.py").run()
    assert not at.exception
    assert at.selectbox(key="replay_run").value == runs["fake pool 48"]
    assert at.session_state["replay_index"] == 5 and at.slider(key="replay_slider").value == 6


def test_engine_page_restarts_with_a_new_block_size(dashboard_env):
    at = app().run()
    at.switch_page("views/engine_settings.py")
    rerun_until(at, lambda a: any(s.label == "block_size" for s in a.selectbox),
                what="the engine form")
    before = RunStore(dashboard_env.db).list_runs()
    next(s for s in at.selectbox if s.label == "block_size").set_value(8)
    next(b for b in at.button if b.label == "Restart engine").click().run()
    assert not at.exception
    assert any("New run" in s.value for s in at.success), [e.value for e in at.error]
    at = rerun_until(app(), lambda a: "× 8 slots" in " ".join(c.value for c in a.caption),
                     what="the sidebar to show the new block size")
    assert len(RunStore(dashboard_env.db).list_runs()) == len(before) + 1

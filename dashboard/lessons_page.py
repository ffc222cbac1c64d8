"""Lessons page: read the story, predict, run the real engine, compare, open the run in Replay.

The lesson texts come from the ``lessons`` package, which never imports torch. A
scenario runs in a subprocess (``python -m engine.cli lesson N --json``), so the
dashboard never loads a model; the page only draws the JSON document it prints
(shape in ``lessons.commands``). The runs are recorded in the same database the
Replay page reads.

Wiring: ``render(replay_page=...)`` is the page body; pass the Replay page (an
``st.Page`` or its path) so "Open in Replay" can switch to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from streamlit.errors import StreamlitAPIException

from engine import envs
from engine.events.folds.pool_snapshot import BlockState, PoolSnapshot
from engine.store.db import is_uri, resolve_db_path
from lessons import LESSONS

from dashboard import palette

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 600  # the slowest lesson takes under a minute on a CPU; leave ample room
# block states, as in the text view: in use, shared (ref > 1), free but cached, free;
# colours from the dashboard's one palette, so a state looks the same on every page
STATE_ORDER = (BlockState.USED, BlockState.SHARED, BlockState.CACHED, BlockState.FREE)
STATE_LABELS = {BlockState.USED: "in use", BlockState.SHARED: "shared (ref > 1)",
                BlockState.CACHED: "free, cached (hittable)", BlockState.FREE: "free"}


def default_model() -> str:
    return envs.LESSON_MODEL.get() or envs.MODEL.get()


def run_lesson(number: int, model: str) -> dict[str, Any]:
    """Run one lesson in a subprocess; its JSON document, or {"error": why}."""
    db = resolve_db_path()
    if not is_uri(db):
        db = os.path.abspath(db)  # the subprocess runs in the repo root
    cmd = [sys.executable, "-m", "engine.cli", "lesson", str(number), "--json",
           "--model", model, "--db", db]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the lesson did not finish within {RUN_TIMEOUT_S} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        doc = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
        return {"error": f"the lesson failed (exit code {proc.returncode}):\n{tail}"}
    return doc


# ---- charts -------------------------------------------------------------------

def chart_figure(spec: dict[str, Any]) -> go.Figure:
    """A bars or lines spec (see lessons.base) as a plotly figure."""
    fig = go.Figure()
    if spec["kind"] == "bars":
        for s in spec["series"]:
            fig.add_bar(name=s["name"], x=spec["categories"], y=s["values"],
                        text=s["values"], textposition="auto",
                        marker_color=palette.color_for(s["name"]))
        # categories ("8", "16", "64" blocks) are labels, not a scale: a numeric axis
        # would squeeze them and hide a bar at its far end
        fig.update_layout(barmode="group")
        fig.update_xaxes(type="category")
    else:
        for s in spec["series"]:
            fig.add_scatter(name=s["name"], x=s["x"], y=s["y"], mode="lines+markers",
                            line_shape="hv",  # values hold for a whole step
                            line_color=palette.color_for(s["name"]))
    fig.update_layout(title=spec["title"], height=320, margin=dict(l=40, r=20, t=50, b=40),
                      xaxis_title=spec.get("x_label") or None,
                      yaxis_title=spec.get("y_label") or None,
                      legend=dict(orientation="h", y=-0.25), showlegend=len(spec["series"]) > 1)
    return fig


def pool_figure(snapshot: PoolSnapshot | dict[str, Any]) -> go.Figure:
    """The pool as a grid of blocks, coloured by state, with owners on hover (the
    lesson document carries the snapshot's JSON form)."""
    if isinstance(snapshot, dict):
        snapshot = PoolSnapshot.from_dict(snapshot)
    owners = {b: [f"{rid}[{i}]" for rid, i in own] for b, own in snapshot.owners().items()}
    blocks = snapshot.blocks
    cols = 16 if len(blocks) <= 64 else 32
    fig = go.Figure()
    for state in STATE_ORDER:  # one trace per state gives a legend for free
        mine = [b for b in blocks if b.state is state]
        fig.add_scatter(
            x=[b.id % cols for b in mine], y=[b.id // cols for b in mine],
            mode="markers+text", name=STATE_LABELS[state], text=[str(b.id) for b in mine],
            textfont=dict(size=9, color="white" if state in (BlockState.USED, BlockState.SHARED)
                          else "#555"),
            marker=dict(symbol="square", size=26, color=palette.BLOCK_COLORS[state]),
            hovertext=[f"block {b.id} | ref {b.ref_count} | {b.num_tokens} tokens | "
                       f"{', '.join(owners.get(b.id, [])) or 'no owner'}" for b in mine],
            hoverinfo="text")
    rows = -(-len(blocks) // cols)
    fig.update_layout(title=f"The pool after step {snapshot.step} "
                      f"({snapshot.num_blocks} blocks x {snapshot.block_size} slots)",
                      height=120 + 32 * rows, margin=dict(l=20, r=20, t=50, b=20),
                      legend=dict(orientation="h", y=-0.1),
                      xaxis=dict(visible=False), yaxis=dict(visible=False, autorange="reversed"))
    return fig


# ---- page parts -------------------------------------------------------------------

def _key(number: int, name: str) -> str:
    return f"lesson_{number}_{name}"


def _move(number: int, delta: int, last: int) -> None:
    k = _key(number, "section")
    st.session_state[k] = min(max(st.session_state.get(k, 0) + delta, 0), last)


def _predictions(lesson: dict[str, Any]) -> None:
    st.subheader("Predict")
    for i, q in enumerate(lesson["questions"], 1):
        k = _key(lesson["number"], f"predict_{q['key']}")
        if q["kind"] == "choice":
            st.radio(f"Q{i}. {q['prompt']}", q["options"], index=None, key=k)
        else:
            st.number_input(f"Q{i}. {q['prompt']}", value=None, step=1, key=k)


def _is_right(q: dict[str, Any], guess: Any) -> bool:
    a = q["answer"]
    if q["kind"] == "choice":
        return guess == a["option"]
    return isinstance(a["value"], (int, float)) and guess is not None and float(guess) == a["value"]


def _answers(doc: dict[str, Any]) -> None:
    st.subheader("Look: what the run says")
    for i, q in enumerate(doc["questions"], 1):
        guess = st.session_state.get(_key(doc["number"], f"predict_{q['key']}"))
        a = q["answer"]
        shown = a["option"] if a["option"] is not None else a["value"]
        if guess is None:
            verdict = "no prediction"
        else:
            # words, not emoji: boxes show where no emoji font is installed
            verdict = ("right: you predicted it" if _is_right(q, guess)
                       else f"not quite: you predicted {guess}")
        st.markdown(f"**Q{i}. {q['prompt']}**  \nComputed from the run: **{shown}** ({verdict})")
        st.caption(a["explanation"])


def _charts(doc: dict[str, Any]) -> None:
    st.subheader("See it")
    for n, spec in enumerate(doc["charts"]):
        if spec["kind"] == "table":
            st.markdown(f"**{spec['title']}**")
            st.dataframe(pd.DataFrame(spec["rows"], columns=spec["columns"]).astype(str),
                         hide_index=True)
        else:
            st.plotly_chart(chart_figure(spec), key=_key(doc["number"], f"chart_{n}"))
        if spec.get("note"):
            st.caption(spec["note"])
    pool = doc["pool"]
    st.plotly_chart(pool_figure(pool["snapshot"]), key=_key(doc["number"], "pool"))
    with st.expander(f"Text view of the pool at step {pool['step']} ({pool['label']})"):
        st.code(pool["text"], language=None)


def _replay_links(doc: dict[str, Any], replay_page: Any) -> None:
    st.subheader("Open the runs in Replay")
    if not doc.get("recorded"):
        st.warning("These runs could not be stored, so they cannot be replayed.")
    for n, r in enumerate(doc["runs"]):
        c1, c2 = st.columns([3, 1])
        step = f", step {r['focus_step']} is the one to look at" if r["focus_step"] else ""
        c1.markdown(f"`{r['run_id']}` {r['label']} ({r['num_steps']} steps{step})")
        if c2.button("Open in Replay", key=_key(doc["number"], f"replay_{n}"),
                     disabled=not r["run_id"]):
            st.session_state["replay_run"] = r["run_id"]
            if r["focus_step"]:
                st.session_state["replay_index"] = max(r["focus_step"] - 1, 0)  # steps count from 1
            try:
                st.switch_page(replay_page)
            except StreamlitAPIException:  # not in the app's navigation (e.g. under AppTest)
                st.info(f"Open the Replay page and pick run {r['run_id']}, or run "
                        f"`kvscope replay {r['run_id']} --step {r['focus_step'] or ''}`")


def render(replay_page: Any = "views/replay.py") -> None:
    """The Lessons page body."""
    st.title("Lessons")
    st.caption("Predict, run the real engine, look, understand. Each scenario runs on the "
               "engine in a separate process and is recorded, so you can replay it.")
    by_number = {x.number: x.catalog() for x in LESSONS}
    number = st.selectbox("Lesson", list(by_number), key="lesson_pick",
                          format_func=lambda n: f"{n}. {by_number[n]['title']}")
    lesson = by_number[number]
    sections = lesson["sections"]
    last = len(sections)  # one page per section, then the predict-and-run page
    idx = min(st.session_state.get(_key(number, "section"), 0), last)
    st.progress((idx + 1) / (last + 1), text=f"{lesson['title']}: page {idx + 1} of {last + 1}")
    if idx < last:
        st.markdown(sections[idx])
    c1, c2, _ = st.columns([1, 1, 4])
    c1.button("Back", key="lesson_prev", disabled=idx == 0, on_click=_move,
              args=(number, -1, last), width="stretch")
    c2.button("Next", key="lesson_next", disabled=idx == last, on_click=_move,
              args=(number, 1, last), width="stretch")
    if idx < last:
        return
    _predictions(lesson)
    model = st.text_input("Model", value=default_model(), key="lesson_model",
                          help="smollm2-135m, a local HF model directory or a .gguf file")
    result_key = _key(number, "result")
    if st.button("Run the scenario on the real engine", icon=":material/play_arrow:", key="lesson_run", type="primary"):
        with st.spinner("Running the scenario on the engine (a few seconds to a minute)…"):
            st.session_state[result_key] = run_lesson(number, model)
    doc = st.session_state.get(result_key)
    if doc is None:
        st.info("Make your predictions, then run the scenario.")
        return
    if "error" in doc:
        st.error(doc["error"])
        return
    st.caption(f"Ran on {doc['model_name']} in {doc['elapsed_s']:.1f} s.")
    _answers(doc)
    _charts(doc)
    st.success(f"**Takeaway.** {doc['takeaway']}")
    _replay_links(doc, replay_page)

"""The frame of a page about an attached deployment (Attached, Fleet): live or stored.

Connected to ``kvscope attach``: the live run, redrawn every refresh (a toggle pauses it).
Otherwise: pick a stored attached run and draw it at its last step. ``draw(frame, now_wall,
live)`` draws the page's body; ``now_wall`` is the wall clock (live) or the last step's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st

from dashboard.attached_frame import AttachedFrame
from dashboard.connection import attached, connection, feed, settings
from dashboard.stored_runs import load_run, run_label
from engine.store.runs import RunStore

Draw = Callable[[AttachedFrame, float, bool], None]


def _live(draw: Draw) -> None:
    view = connection().view()
    f = feed()
    frame = f.frame(view, f.poll(view))
    if not isinstance(frame, AttachedFrame):
        st.info("Waiting for the attach server's first snapshot…")
        return
    draw(frame, time.time(), True)


def _stored(key: str, draw: Draw, how: str | None) -> None:
    store = RunStore()
    runs = [r for r in store.list_runs() if r.get("kind") == "attached" and r.get("num_steps")]
    if how:
        st.markdown(how)
    if not runs:
        st.info(f"No attached run is stored in `{store.path}` yet.")
        return
    by_id = {r["id"]: r for r in runs}
    rid = st.selectbox("Stored attached run", list(by_id), key=f"{key}_run",
                       format_func=lambda i: run_label(by_id[i]))
    sr = load_run(store, by_id[rid])
    st.caption(f"Its last step ({sr.steps[-1]}); step through it on the Replay page.")
    draw(sr.frame(len(sr.records) - 1), sr.records[-1].ts, False)


def attached_page(title: str, key: str, draw: Draw, how: str | None = None) -> None:
    st.title(title)
    if attached():
        paused = st.toggle("Pause updates", key=f"{key}_paused")
        st.fragment(run_every=None if paused else settings().refresh_s)(lambda: _live(draw))()
    else:
        _stored(key, draw, how)

"""Replay: a stored run step by step, drawn by the same run view as Live."""

from __future__ import annotations

import bisect

import streamlit as st

from engine.store.runs import RunStore

from dashboard.attached_frame import AttachedFrame
from dashboard.attached_view import render_attached_view
from dashboard.panels import render_run_view
from dashboard.run_summary import CONFIG_KEYS
from dashboard.stored_runs import StoredRun, load_run, run_label

PLAY_PERIOD_S = 0.5  # two frames a second: slow enough to read the grid change


def _new_run() -> None:
    """The user picked another run: start it from its first step, paused."""
    st.session_state["replay_index"] = 0
    st.session_state["replay_playing"] = False


def _pick_run(store: RunStore) -> dict | None:
    runs = store.list_runs()
    if not runs:
        st.info(f"No stored runs in `{store.path}` yet. Runs are recorded while "
                "`kvscope serve` runs: submit something on the Submit page, then come back.")
        return None
    by_id = {r["id"]: r for r in runs}
    wanted = st.session_state.get("replay_run")
    if wanted not in by_id:
        st.session_state["replay_run"] = runs[0]["id"]
    rid = st.selectbox("Run", list(by_id), key="replay_run", on_change=_new_run,
                       format_func=lambda i: run_label(by_id[i]))
    return by_id[rid]


def _run_details(store: RunStore, run: dict) -> None:
    cfg = run.get("config") or {}
    sim = cfg.get("simulated") if run.get("kind") == "simulated" else None
    if isinstance(sim, dict):
        st.caption(simulated_note(sim))
    with st.expander("Run details: engine config and label"):
        if run.get("kind") == "attached":
            st.caption("An attached run: `kvscope attach` recorded these pods' KV event streams.")
            st.dataframe(cfg.get("pods") or [], hide_index=True)
        else:
            st.dataframe([{"setting": k, "value": str(cfg.get(k, run.get(k, "–")))}
                          for k in CONFIG_KEYS], hide_index=True)
        with st.form(f"label_{run['id']}", border=False):
            label = st.text_input("Label", value=run.get("label") or "",
                                  placeholder="e.g. block_size 8, shared system prompt")
            if st.form_submit_button("Save label"):
                store.label_run(run["id"], label.strip() or None)
                st.rerun()


def simulated_note(sim: dict) -> str:
    """What a simulated run is, and which of its fleet's pods were recorded."""
    n, kept = sim.get("pods", 1), sim.get("recorded_pods")
    text = (f"A simulated run (`kvscope simulate`): pod {sim.get('pod')} of {n} behind the "
            f"{sim.get('router')} router, on the virtual clock of its step-cost model.")
    if kept is not None and len(kept) < n:
        text += (f" Only pod{'s' * (len(kept) > 1)} {', '.join(map(str, kept))} of the {n} were recorded: "
                 f"the others were simulated the same way but kept no events.")
    return text


def _set_index(i: int | None) -> None:
    if i is not None:
        st.session_state["replay_index"] = i


def _toggle_play(idx: int, last: int) -> None:
    playing = not st.session_state.get("replay_playing", False)
    st.session_state["replay_playing"] = playing
    if playing and idx >= last:
        st.session_state["replay_index"] = -1  # play again from the first step


def _controls(sr: StoredRun, idx: int) -> None:
    """Play/pause, single steps and 'jump to next …' buttons (callbacks set the index)."""
    last = len(sr.records) - 1
    playing = st.session_state.get("replay_playing", False)
    cols = st.columns([1.1, 1, 1, 1.5, 1.5, 1.5])
    label = ":material/pause: Pause" if playing else ":material/play_arrow: Play"
    cols[0].button(label, on_click=_toggle_play, args=(idx, last), key="replay_play",
                   width="stretch")
    cols[1].button(":material/skip_previous: step", on_click=_set_index, args=(max(idx - 1, 0),),
                   disabled=idx == 0, key="replay_prev", width="stretch")
    cols[2].button("step :material/skip_next:", on_click=_set_index, args=(min(idx + 1, last),),
                   disabled=idx >= last, key="replay_next", width="stretch")
    for col, kind in zip(cols[3:], sr.jumps):
        target = sr.next_index(idx, kind)
        col.button(f"next {kind} :material/fast_forward:", on_click=_set_index, args=(target,),
                   disabled=target is None, key=f"replay_jump_{kind}", width="stretch",
                   help=f"jump to the next step with a {kind}" if target is not None
                   else f"no {kind} after this step")


def _player(sr: StoredRun, ticking: bool) -> None:
    """Slider, controls and the run view; re-run every PLAY_PERIOD_S while playing.

    ``ticking``: whether this fragment was created with a timer. Play/pause changes
    the timer, which needs a whole-app rerun (a fragment cannot retime itself)."""
    last = len(sr.records) - 1
    idx = min(max(int(st.session_state.get("replay_index", 0)), -1), last)
    playing = bool(st.session_state.get("replay_playing"))
    if playing and idx >= last:
        st.session_state["replay_playing"] = playing = False
    if playing != ticking:
        st.rerun(scope="app")
    if playing:
        idx += 1
    idx = max(idx, 0)
    st.session_state["replay_index"] = idx
    steps = sr.steps
    # the slider shows engine step numbers; a value maps back to the latest record at or
    # before it (steps are consecutive in practice, but a run may skip idle ones)
    st.session_state["replay_slider"] = steps[idx]
    if len(steps) > 1:
        st.slider("Step", min_value=steps[0], max_value=steps[-1], key="replay_slider",
                  on_change=lambda: _set_index(
                      max(bisect.bisect_right(steps, st.session_state["replay_slider"]) - 1, 0)))
    _controls(sr, idx)
    frame = sr.frame(idx)
    if isinstance(frame, AttachedFrame):
        render_attached_view(frame, marker=steps[idx])
    else:
        render_run_view(frame, marker=steps[idx], timeline=[r.metrics for r in sr.records])


def page() -> None:
    st.title("Replay a stored run")
    st.caption("Every run `kvscope serve` (or `kvscope attach`) records is stored in SQLite; its "
               "pool (or an attached deployment's cache) is rebuilt here step by step by the same "
               "reducer the Live page uses.")
    store = RunStore()
    run = _pick_run(store)
    if run is None:
        return
    _run_details(store, run)
    if not run.get("num_steps"):
        st.warning("This run has no recorded steps yet.")
        return
    sr = load_run(store, run)
    playing = bool(st.session_state.get("replay_playing"))
    st.fragment(run_every=PLAY_PERIOD_S if playing else None)(_player)(sr, playing)


page()

"""Live: the engine's paged KV cache as it runs, redrawn twice a second.

Every redraw shows one step: the LiveFeed hands over a frame whose parts are all of
that step (or the previous good frame), and the run view builds every figure before
it draws any. Streamlit's fading of elements a rerun has not reached yet is turned
off on this page: a redraw replaces a whole frame, nothing is half-stale.
"""

from __future__ import annotations

import time

import streamlit as st

from dashboard.attached_frame import AttachedFrame
from dashboard.attached_view import render_attached_view
from dashboard.connection import attached, connection, feed, server_status, settings
from dashboard.engine_actions import abort_everything, reset_prefix_cache
from dashboard.load_times import loading_note
from dashboard.panels import render_run_view

# Streamlit dims the elements of the previous run until the rerun reaches them (and
# fades them in); a live redraw of a whole frame must not blink or look half-stale.
NO_STALE_CSS = """
<style>
[data-stale="true"] {opacity: 1 !important; transition: none !important;}
</style>
"""


def _waiting_for_server(view) -> None:
    """Loading progress (from /healthz) until the client has a folded state."""
    srv = server_status()
    if srv.status == "error":
        st.error(f"The server failed: {srv.detail}")
        if srv.managed is not None:
            with st.expander("server log"):
                st.code(srv.managed.log_tail(40) or "(empty)")
        return
    if srv.status == "unreachable":
        st.warning(f"No kvscope server answers at {settings().url}. Start one with "
                   "`kvscope serve` (or let the dashboard start it: unset KVSCOPE_AUTOSTART).")
        return
    started = st.session_state.setdefault("_live_wait_since", time.time())
    with st.status(f"Waiting for the engine: {srv.status}", state="running", expanded=True):
        st.write(srv.detail or f"connection: {view.status}")
        st.caption(f"{time.time() - started:.0f} s so far. {loading_note()}")


def _body() -> None:
    view = connection().view()
    if ((view.config or {}).get("kind") == "attached") != st.session_state.get("_live_attached"):
        st.rerun(scope="app")  # the header (title, reset button) was drawn for the other kind
    if view.state is None or view.status not in ("live", "resyncing"):
        _waiting_for_server(view)
        return
    st.session_state.pop("_live_wait_since", None)
    f = feed()
    frame = f.frame(view, f.poll(view))
    if frame is None:
        st.caption("Waiting for the first consistent step…")
        return
    if view.status == "resyncing":
        st.caption(f"Resynchronising: this client fell behind and asked for a fresh "
                   f"snapshot; showing step {frame.step} until it arrives.")
    if isinstance(frame, AttachedFrame):
        render_attached_view(frame)
    else:
        render_run_view(frame)


def page() -> None:
    connection().wait_live(timeout=2.0)  # a just-opened connection needs a moment to say what it is
    watching = st.session_state["_live_attached"] = attached()
    st.html(NO_STALE_CSS)
    st.title("Live: an attached deployment's prefix cache" if watching
             else "Live: the paged KV cache right now")
    left, mid, reset, stop = st.columns([2, 1.1, 1.1, 1.1])
    if watching:
        left.caption("kvscope attach follows a vLLM / SGLang / kvscope deployment's KV cache "
                     "events; each step is one batch a pod published.")
    else:
        left.caption("Each cell is one physical KV block. Submit requests (or a teaching preset) "
                     "and watch blocks get allocated, shared, copied on write, cached and evicted.")
    paused = mid.toggle("Pause updates", key="live_paused",
                        help="Freeze the view to inspect it (hover the blocks).")
    if not watching:  # a watched deployment is someone else's: nothing to reset or abort from here
        reset.button("Reset prefix cache", on_click=reset_prefix_cache, key="live_reset",
                     help="Forget every cached hash: the next identical prompt misses (cold).")
        stop.button("Abort everything", on_click=abort_everything, key="live_abort_all",
                    help="Abort every request on the engine, whoever submitted it.")
    period = None if paused else settings().refresh_s
    st.fragment(run_every=period)(_body)()


page()

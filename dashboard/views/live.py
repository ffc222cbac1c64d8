"""Live: the engine's paged KV cache as it runs, redrawn twice a second.

Every redraw shows one step: the LiveFeed hands over a frame whose parts are all of
that step (or the previous good frame), and the run view builds every figure before
it draws any. Streamlit's fading of elements a rerun has not reached yet is turned
off on this page: a redraw replaces a whole frame, nothing is half-stale.
"""

from __future__ import annotations

import time

import streamlit as st

from dashboard.connection import connection, feed, server_status, settings
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
    render_run_view(frame)


def page() -> None:
    st.html(NO_STALE_CSS)
    st.title("Live: the paged KV cache right now")
    left, mid, reset, stop = st.columns([2, 1.1, 1.1, 1.1])
    left.caption("Each cell is one physical KV block. Submit requests (or a teaching preset) "
                 "and watch blocks get allocated, shared, copied on write, cached and evicted.")
    paused = mid.toggle("Pause updates", key="live_paused",
                        help="Freeze the view to inspect it (hover the blocks).")
    reset.button("Reset prefix cache", on_click=reset_prefix_cache, key="live_reset",
                 help="Forget every cached hash: the next identical prompt misses (cold).")
    stop.button("Abort everything", on_click=abort_everything, key="live_abort_all",
                help="Abort every request on the engine, whoever submitted it.")
    period = None if paused else settings().refresh_s
    st.fragment(run_every=period)(_body)()


page()

"""Live: the engine's paged KV cache as it runs, redrawn twice a second."""

from __future__ import annotations

import time

import streamlit as st

from engine.client import ServerError

from dashboard.attached_frame import AttachedFrame
from dashboard.attached_view import render_attached_view
from dashboard.connection import attached, connection, feed, server_status, settings
from dashboard.panels import render_run_view


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
        st.caption(f"{time.time() - started:.0f} s · the default model takes ~20 s on the "
                   "first start (it dequantizes and caches its weights).")


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
    if view.status == "resyncing":
        st.caption("Resynchronising: this client fell behind and asked for a fresh snapshot.")
    if isinstance(frame, AttachedFrame):
        render_attached_view(frame)
    else:
        render_run_view(frame)


def _reset_prefix_cache() -> None:
    try:
        res = connection().reset_prefix_cache(timeout=10)
        st.toast(f"Prefix cache reset: {res.result}")
    except (ServerError, TimeoutError) as exc:
        st.toast(f"Reset failed: {exc}")


def page() -> None:
    connection().wait_live(timeout=2.0)  # a just-opened connection needs a moment to say what it is
    watching = st.session_state["_live_attached"] = attached()
    st.title("Live: an attached deployment's prefix cache" if watching
             else "Live: the paged KV cache right now")
    left, mid, right = st.columns([2, 1.2, 1.2])
    if watching:
        left.caption("kvscope attach follows a vLLM / SGLang / kvscope deployment's KV cache "
                     "events; each step is one batch a pod published.")
    else:
        left.caption("Each cell is one physical KV block. Submit requests (or a teaching preset) "
                     "and watch blocks get allocated, shared, copied on write, cached and evicted.")
    paused = mid.toggle("Pause updates", key="live_paused",
                        help="Freeze the view to inspect it (hover the blocks).")
    if not watching:  # a watched deployment is someone else's: nothing to reset from here
        right.button("Reset prefix cache", on_click=_reset_prefix_cache, key="live_reset",
                     help="Forget every cached hash: the next identical prompt misses (cold).")
    period = None if paused else settings().refresh_s
    st.fragment(run_every=period)(_body)()


page()

"""Sidebar: what the dashboard is connected to and the colour key shared by every page."""

from __future__ import annotations

import streamlit as st

from dashboard import palette
from dashboard.connection import connection, server_status, settings

STATUS_REFRESH_S = 2.0  # the sidebar only needs to notice loading → ready, not every step


def legend_html() -> str:
    """The block-state colour key as small swatches (same colours as every chart)."""
    row = ("<div style='display:flex;align-items:center;gap:6px;margin:2px 0'>"
           "<span style='width:14px;height:14px;{style};display:inline-block'></span>"
           "<span style='font-size:0.85rem'>{label}</span></div>")
    items = "".join(row.format(style=f"background:{palette.BLOCK_COLORS[s]};border:1px solid #64748B",
                               label=palette.BLOCK_LABELS[s]) for s in palette.BLOCK_STATES)
    return items + row.format(style=f"border:2px solid {palette.CHANGED}",
                              label="changed in the last step")


@st.fragment(run_every=STATUS_REFRESH_S)
def _status() -> None:
    cfg = settings()
    srv = server_status()
    view = connection().view()
    where = f"`{cfg.url}`" + (" (started by the dashboard)" if srv.managed else "")
    if view.status == "live" and view.config:
        c = view.config
        st.success(f"**live** · {where}", icon=":material/check_circle:")
        if c.get("kind") == "attached":
            pods = ", ".join(p.get("pod", "?") for p in c.get("pods") or [])
            st.caption(f"attached to {pods} · run `{view.run_id}`")
        else:
            st.caption(f"model {c.get('model_name', c.get('model', '?'))} · "
                       f"{c.get('num_blocks')} blocks × {c.get('block_size')} slots · "
                       f"run `{view.run_id}`")
    elif srv.status == "error":
        st.error(f"server error · {where}\n\n{srv.detail}", icon=":material/error:")
    elif srv.status == "unreachable":
        st.warning(f"no server at {where}. Start one with `kvscope serve`, or unset "
                   "KVSCOPE_AUTOSTART=0.", icon=":material/cloud_off:")
    else:
        st.info(f"**{srv.status}** · {where}\n\n{srv.detail or view.status}",
                icon=":material/hourglass_top:")


def render_sidebar() -> None:
    with st.sidebar:
        st.markdown("**Engine**")
        _status()
        if (connection().view().config or {}).get("kind") != "attached":  # no block grid there
            st.markdown("**Block colours**")
            st.html(legend_html())

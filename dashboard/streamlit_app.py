"""kvscope dashboard entry point: `streamlit run dashboard` (from the repo root).

Streamlit resolves a directory argument to its ``streamlit_app.py`` and puts that
directory (not the repo root) on sys.path, so the repo root is added here for the
``engine`` and ``dashboard`` packages. Pages are registered with st.navigation;
each page file lives in views/ (not pages/, which would trigger Streamlit's
legacy auto-discovery).
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import theme  # noqa: E402
from dashboard.sidebar import render_sidebar  # noqa: E402

st.set_page_config(page_title="kvscope: see PagedAttention", page_icon=":material/grid_view:",
                   layout="wide", initial_sidebar_state="expanded")

# Material icons ship with Streamlit's font; emoji need a system emoji font.
PAGES = [
    st.Page("views/live.py", title="Live", icon=":material/grid_view:", default=True),
    st.Page("views/submit.py", title="Submit", icon=":material/send:"),
    st.Page("views/replay.py", title="Replay", icon=":material/replay:"),
    st.Page("views/attached.py", title="Attached", icon=":material/hub:"),
    st.Page("views/fleet.py", title="Fleet", icon=":material/lan:"),
    st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("views/simulate.py", title="Simulate", icon=":material/science:"),
    st.Page("views/lessons.py", title="Lessons", icon=":material/school:"),
    st.Page("views/engine_settings.py", title="Engine", icon=":material/settings:"),
]

page = st.navigation(PAGES)
theme.apply()
render_sidebar()
page.run()

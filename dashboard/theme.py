"""Page styling that makes the dashboard fit 1280×800: tighter top padding, smaller
headline numbers (eight KPIs fit one row), compact titles."""

from __future__ import annotations

import streamlit as st

_CSS = """
<style>
.block-container {padding-top: 3.4rem; padding-bottom: 1rem;}  /* clears the 3.3rem header */
h1 {font-size: 1.7rem !important; padding-top: 0 !important;}
h2 {font-size: 1.25rem !important;}
h3 {font-size: 1.1rem !important;}
[data-testid="stMetricValue"] {font-size: 1.35rem;}
[data-testid="stMetricLabel"] p {font-size: 0.8rem;}
</style>
"""


def apply() -> None:
    st.html(_CSS)

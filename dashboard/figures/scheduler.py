"""Scheduler: how each step's token budget was spent, and the request queues.

There is no separate prefill phase (DESIGN.md): every step mixes decode tokens of
running requests with prefill chunks, up to ``max_num_batched_tokens``.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
from dashboard.figures.style import base_layout, empty_figure


def budget_figure(df: pd.DataFrame) -> go.Figure:
    """Stacked bars per step: prefill-chunk tokens and decode tokens; the budget line."""
    title = "Tokens scheduled per step: prefill chunks + decodes vs the token budget (tokens)"
    if df.empty or "num_prefill_tokens" not in df:
        return empty_figure(title, "No steps yet.")
    fig = go.Figure()
    fig.add_trace(go.Bar(x=df["step"], y=df["num_prefill_tokens"], name="prefill-chunk tokens",
                         marker_color=palette.PREFILL))
    fig.add_trace(go.Bar(x=df["step"], y=df["num_decode_tokens"], name="decode tokens",
                         marker_color=palette.DECODE))
    if "token_budget" in df:
        fig.add_trace(go.Scatter(x=df["step"], y=df["token_budget"], mode="lines",
                                 name="budget (max_num_batched_tokens)",
                                 line=dict(color=palette.BUDGET, dash="dash", width=1.5,
                                           shape="hv")))
    base_layout(fig, title=title, height=300)
    fig.update_layout(barmode="stack", bargap=0.05)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="tokens per step", rangemode="tozero")
    return fig


def queues_figure(df: pd.DataFrame) -> go.Figure:
    """Waiting, running and preempted requests after each step (count)."""
    title = "Requests waiting, running and preempted after each step (count)"
    if df.empty or "num_requests_running" not in df:
        return empty_figure(title, "No steps yet.")
    fig = go.Figure()
    for status, color in palette.REQUEST_STATUS_COLORS.items():
        col = f"num_requests_{status}"
        if col in df:
            fig.add_trace(go.Scatter(x=df["step"], y=df[col], name=status, mode="lines",
                                     line=dict(color=color, width=2, shape="hv")))
    base_layout(fig, title=title, height=260)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="requests", rangemode="tozero")
    return fig

"""Counts per step over time: evictions, copy-on-write copies and preemptions.

Bars at the steps where they happened make rare events easy to spot; the
cumulative totals sit in the legend, so a long run still reads at a glance.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
from dashboard.figures.style import base_layout, empty_figure

SERIES = (("eviction", "num_evictions_step", "num_evictions"),
          ("copy-on-write", "cow_copies_step", "cow_copies"),
          ("preemption", "num_preemptions_step", "num_preemptions"))


def events_figure(df: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Per-step event counts; ``step`` draws a marker at the shown step (replay)."""
    title = "Evictions, copy-on-write copies and preemptions per step (count)"
    if df.empty:
        return empty_figure(title, "No steps yet.")
    fig = go.Figure()
    for name, per_step, total in SERIES:
        y = df.get(per_step, pd.Series(0, index=df.index)).fillna(0)
        tot = int(df[total].iloc[-1]) if total in df and pd.notna(df[total].iloc[-1]) else 0
        fig.add_trace(go.Bar(x=df["step"], y=y, name=f"{name}s (total {tot})",
                             marker_color=palette.EVENT_COLORS[name],
                             hovertemplate=f"step %{{x}}: %{{y}} {name}(s)<extra></extra>"))
    base_layout(fig, title=title, height=280)
    fig.update_layout(barmode="group", bargap=0.1)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="events per step (count)", rangemode="tozero")
    if step is not None:
        fig.add_vline(x=step, line=dict(color="#111827", width=1, dash="dot"))
    return fig

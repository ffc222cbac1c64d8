"""Prefix cache: hit rate over time and where the misses come from.

Misses are split by cause (engine.events.metrics: cold, evicted, partial,
disabled) because a bare hit rate does not say what to fix (vLLM #54607: a 0%
hit rate caused by a shared prefix shorter than one block).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette as P
from dashboard.figures.style import base_layout, empty_figure

MISS_HELP = {
    "cold": "never cached",
    "evicted": "cached once, evicted since",
    "partial": "shorter than one block",
    "disabled": "prefix caching off",
}


def hit_rate_figure(df: pd.DataFrame) -> go.Figure:
    """Cumulative hit rate and the hit rate of each step's lookups (percent)."""
    title = "Prefix cache hit rate (% of prompt tokens found cached)"
    if df.empty or "prefix_cache_hit_rate" not in df or df["prefix_cache_hit_rate"].isna().all():
        return empty_figure(title, "No prefix-cache lookups yet: a lookup happens when a "
                                   "request is admitted.")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["step"], y=df["prefix_cache_hit_rate"] * 100,
                             name="cumulative (this run)", mode="lines",
                             line=dict(color=P.BLOCK_COLORS[P.USED], width=2),
                             connectgaps=True))
    step_rate = df.get("prefix_cache_hit_rate_step")
    if step_rate is not None:
        fig.add_trace(go.Scatter(x=df["step"], y=step_rate * 100, name="lookups in this step",
                                 mode="markers", marker=dict(color=P.HIT, size=7)))
    base_layout(fig, title=title, height=280)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="hit rate (%)", range=[-2, 102])
    return fig


def misses_figure(df: pd.DataFrame) -> go.Figure:
    """Cumulative prompt tokens: hits and misses by cause (stacked, tokens)."""
    title = "Prompt tokens: hits and misses by cause (cumulative tokens)"
    if df.empty or "prefix_cache_queries" not in df or not df["prefix_cache_queries"].max():
        return empty_figure(title, "No prompt tokens looked up yet.")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["step"], y=df["prefix_cache_hits"], name="hit",
                             stackgroup="t", line=dict(color=P.HIT, width=0.5)))
    for cause, color in P.MISS_COLORS.items():
        col = f"prefix_cache_miss_{cause}"
        if col in df:
            fig.add_trace(go.Scatter(x=df["step"], y=df[col], stackgroup="t",
                                     name=f"miss: {cause}",
                                     hovertemplate=f"step %{{x}}: %{{y}} tokens missed "
                                                   f"({MISS_HELP[cause]})<extra></extra>",
                                     line=dict(color=color, width=0.5)))
    base_layout(fig, title=title, height=300, legend_lines=2)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="prompt tokens (cumulative)", rangemode="tozero")
    return fig

"""Two runs on shared axes: the same metric over engine steps, run A vs run B."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
from dashboard.figures.style import base_layout, empty_figure

# (metric column, title with unit, scale to display unit)
PANELS = (
    ("kv_cache_usage", "Blocks in use: kv_cache_usage (%)", 100.0),
    ("kv_token_usage", "Token slots filled: kv_token_usage (%)", 100.0),
    ("internal_fragmentation", "Internal fragmentation (%)", 100.0),
    ("prefix_cache_hit_rate", "Prefix cache hit rate, cumulative (%)", 100.0),
    ("num_requests_running", "Running requests (count)", 1.0),
    ("num_batched_tokens", "Tokens scheduled per step (tokens)", 1.0),
)


def overlay_figure(a: pd.DataFrame, b: pd.DataFrame, column: str, title: str, scale: float,
                   names: tuple[str, str] = ("run A", "run B")) -> go.Figure:
    """One metric of both runs against the engine step."""
    if column not in a and column not in b:
        return empty_figure(title, "Neither run recorded this metric.")
    fig = go.Figure()
    for df, name, color in ((a, names[0], palette.RUN_A), (b, names[1], palette.RUN_B)):
        if column in df:
            fig.add_trace(go.Scatter(x=df["step"], y=df[column] * scale, name=name,
                                     mode="lines", line=dict(color=color, width=2),
                                     connectgaps=True))
    base_layout(fig, title=title, height=260)
    fig.update_xaxes(title_text="engine step")
    unit = title.rsplit("(", 1)[-1].rstrip(")")
    fig.update_yaxes(title_text=unit, rangemode="tozero")
    return fig

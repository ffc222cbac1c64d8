"""Layout defaults every figure shares: legend on, units in axis titles, compact margins.

Title and legend sit in the top margin, each on its own line, placed in container
(pixel-derived) coordinates so they never overlap the plot or each other whatever
the figure height.
"""

from __future__ import annotations

import plotly.graph_objects as go

TITLE_PX = 30   # title line, from the top edge
LEGEND_PX = 26  # one legend line below it


def base_layout(fig: go.Figure, *, title: str, height: int = 300, top: int | None = None,
                legend_lines: int = 1) -> go.Figure:
    """Apply the house layout; ``title`` says what and in which unit. ``legend_lines``:
    how many lines the horizontal legend may wrap into (reserves the margin)."""
    top = top if top is not None else TITLE_PX + LEGEND_PX * legend_lines + 14
    fig.update_layout(
        title=dict(text=title, font=dict(size=14), x=0, xref="container", xanchor="left",
                   y=1 - 8 / height, yref="container", yanchor="top", pad=dict(l=8)),
        legend=dict(orientation="h", x=0, xanchor="left", y=1 - TITLE_PX / height,
                    yref="container", yanchor="top", traceorder="normal",
                    font=dict(size=11), bgcolor="rgba(255,255,255,0)"),
        height=height, margin=dict(l=60, r=16, t=top, b=44), showlegend=True,
        plot_bgcolor="white", hovermode="closest", font=dict(size=12),
    )
    fig.update_xaxes(gridcolor="#F1F5F9", zerolinecolor="#E2E8F0")
    fig.update_yaxes(gridcolor="#F1F5F9", zerolinecolor="#E2E8F0")
    return fig


def legend_swatch(name: str, color: str, symbol: str = "square") -> go.Scatter:
    """A legend-only entry (no data) for traces such as heatmaps that draw no legend."""
    return go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                      marker=dict(symbol=symbol, size=12, color=color,
                                  line=dict(width=1, color="#64748B")))


def empty_figure(title: str, message: str, height: int = 220) -> go.Figure:
    """A placeholder that says why there is nothing to plot yet."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font=dict(size=13, color="#64748B"))
    base_layout(fig, title=title, height=height)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig

"""Latency distributions: time to first token and inter-token latency (milliseconds)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import palette
from dashboard.figures.style import base_layout, empty_figure

QUANTILES = ((50, "solid"), (90, "dash"), (99, "dot"))


def _ms(xs: list[float]) -> list[float]:
    return [x * 1000.0 for x in xs]


def _subtitle(name: str, n: int, latest: dict[str, Any], key: str) -> str:
    qs = [f"p{q} {latest[f'{key}_p{q}_s'] * 1000:.0f}"
          for q, _ in QUANTILES if latest.get(f"{key}_p{q}_s") is not None]
    return f"{name} (n={n})" + (": " + " · ".join(qs) + " ms" if qs else "")


def latency_figure(samples: dict[str, list[float]], latest: dict[str, Any]) -> go.Figure:
    """Histograms of TTFT and ITL (ms); the run's p50/p90/p99 as vertical lines."""
    title = "Latency distributions (milliseconds; lines: run percentiles)"
    if not samples.get("ttft_s") and not samples.get("itl_s"):
        return empty_figure(title, "No first tokens yet.")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        _subtitle("time to first token", len(samples["ttft_s"]), latest, "ttft"),
        _subtitle("inter-token latency", len(samples["itl_s"]), latest, "itl")))
    for col, key, color, name in ((1, "ttft", palette.TTFT, "TTFT"), (2, "itl", palette.ITL, "ITL")):
        fig.add_trace(go.Histogram(x=_ms(samples[f"{key}_s"]), name=f"{name} (count per bin)",
                                   marker_color=color, nbinsx=30, opacity=0.85),
                      row=1, col=col)
        for q, dash in QUANTILES:
            v = latest.get(f"{key}_p{q}_s")
            if v is not None:
                fig.add_vline(x=v * 1000, line=dict(color="#111827", dash=dash, width=1),
                              row=1, col=col)
        fig.update_xaxes(title_text=f"{name} (ms)", row=1, col=col)
        fig.update_yaxes(title_text="observations", row=1, col=col)
    for q, dash in QUANTILES:  # legend entries for the percentile line styles
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"p{q}",
                                 line=dict(color="#111827", dash=dash, width=1)))
    base_layout(fig, title=title, height=320, top=96)
    fig.update_annotations(font_size=12)
    return fig

"""Fragmentation: where the pool's token slots go, paged vs contiguous, and over time.

Internal fragmentation (empty slots of partial last blocks) is the only waste
paging leaves; contiguous allocation adds over-reservation and external
fragmentation, so fewer requests fit in the same memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
from dashboard.contiguous import VARIANT_LABELS, Baselines
from dashboard.figures.style import base_layout, empty_figure


def split_figure(rows: Sequence[dict[str, Any]], capacity: int, step: int) -> go.Figure:
    """Stacked horizontal bars: each allocator's token slots by category."""
    title = (f"Where the {capacity} token slots go at step {step} "
             f"(token slots; same capacity, same requests)")
    labels = [f"{r['variant']}<br>running {r['running']} · waiting {r['waiting']}" for r in rows]
    fig = go.Figure()
    for cat, color in palette.MEMORY_COLORS.items():
        xs = [r.get(cat, 0) for r in rows]
        if not any(xs):
            continue
        fig.add_trace(go.Bar(
            y=labels, x=xs, orientation="h", name=cat, marker_color=color,
            hovertemplate=f"{cat}: %{{x}} slots<extra></extra>",
            marker_line=dict(color="white", width=0.5)))
    base_layout(fig, title=title, height=150 + 60 * len(rows), legend_lines=1)
    fig.update_layout(barmode="stack", bargap=0.3)
    fig.update_xaxes(title_text="token slots", range=[0, capacity])
    fig.update_yaxes(autorange="reversed", title_text="allocator")
    return fig


def usage_figure(df: pd.DataFrame, step: int | None = None) -> go.Figure:
    """kv_cache_usage vs kv_token_usage vs internal fragmentation (percent)."""
    title = "Block usage vs token usage, and internal fragmentation (%)"
    if df.empty or "kv_cache_usage" not in df:
        return empty_figure(title, "No steps yet.")
    fig = go.Figure()
    for col, name, color in (
            ("kv_cache_usage", "kv_cache_usage: blocks referenced / all blocks", palette.KV_CACHE_USAGE),
            ("kv_token_usage", "kv_token_usage: filled slots / all slots", palette.KV_TOKEN_USAGE),
            ("internal_fragmentation",
             "internal fragmentation: empty slots / slots of referenced blocks",
             palette.FRAGMENTATION)):
        fig.add_trace(go.Scatter(x=df["step"], y=df[col] * 100, name=name, mode="lines",
                                 line=dict(color=color, width=2)))
    base_layout(fig, title=title, height=340, legend_lines=3)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="percent", range=[-2, 102])
    if step is not None:
        fig.add_vline(x=step, line=dict(color="#111827", width=1, dash="dot"))
    return fig


def concurrency_figure(base: Baselines | None, step: int | None = None) -> go.Figure:
    """Running requests per step: paged vs both contiguous variants (requests)."""
    title = "How many requests run at once: paged vs contiguous (requests)"
    if base is None or not base.paged:
        return empty_figure(title, "No steps yet.")
    fig = go.Figure()
    series = [("paged", base.paged, palette.BLOCK_COLORS[palette.USED], "solid")]
    for v, dash in (("max_model_len", "dot"), ("prompt_plus_max_tokens", "dash")):
        series.append((v, list(base.results[v].steps), palette.MEMORY_COLORS["reserved, unused"],
                       dash))
    for v, rows, color, dash in series:
        fig.add_trace(go.Scatter(x=[r.step for r in rows], y=[r.num_running for r in rows],
                                 name=VARIANT_LABELS[v], mode="lines",
                                 line=dict(color=color if v == "paged" else "#B91C1C",
                                           dash=dash, width=2, shape="hv")))
    base_layout(fig, title=title, height=340, legend_lines=3)
    fig.update_xaxes(title_text="engine step (contiguous runs take longer to finish)")
    fig.update_yaxes(title_text="running requests", rangemode="tozero")
    if step is not None:
        fig.add_vline(x=step, line=dict(color="#111827", width=1, dash="dot"))
    return fig

"""Prefix cache: hit rate over time and where the misses come from.

Misses are split by cause (engine.events.metrics.step_metrics: cold, evicted, partial,
disabled) because a bare hit rate does not say what to fix (vLLM #54607: a 0%
hit rate caused by a shared prefix shorter than one block). The lookups of
requests resumed after a preemption are drawn apart, as "recomputed after
preemption" (and the part they found cached again): like vLLM, the hit rate
leaves them out, so a victim re-finding its own blocks does not inflate it
(vLLM #25780).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
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
                             line=dict(color=palette.BLOCK_COLORS[palette.USED], width=2),
                             connectgaps=True))
    step_rate = df.get("prefix_cache_hit_rate_step")
    if step_rate is not None:
        fig.add_trace(go.Scatter(x=df["step"], y=step_rate * 100, name="lookups in this step",
                                 mode="markers", marker=dict(color=palette.HIT, size=7)))
    base_layout(fig, title=title, height=280)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="hit rate (%)", range=[-2, 102])
    return fig


RESUMED = (("prefix_cache_resumed_hits", "after preemption: found cached again",
            palette.RESUMED_HIT, "tokens a resumed request found cached again"),
           ("prefix_cache_resumed_misses", "recomputed after preemption", palette.RECOMPUTED,
            "tokens a preempted request computes a second time"))


def _looked_up(df: pd.DataFrame) -> pd.Series:
    """Every token a lookup covered, per step row: first admissions (caching on or off)
    and resumed requests."""
    total = pd.Series(0, index=df.index)
    for col in ("prefix_cache_queries", "prefix_cache_miss_disabled",
                "prefix_cache_resumed_queries"):
        if col in df:
            total = total + df[col].fillna(0)
    return total


def misses_figure(df: pd.DataFrame) -> go.Figure:
    """Cumulative prompt tokens: hits, misses by cause and the lookups of resumed
    requests (stacked, tokens)."""
    title = "Prompt tokens: hits and misses by cause (cumulative tokens)"
    if df.empty or not _looked_up(df).max():
        return empty_figure(title, "No prompt tokens looked up yet.")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["step"], y=df["prefix_cache_hits"], name="hit",
                             stackgroup="t", line=dict(color=palette.HIT, width=0.5)))
    for cause, color in palette.MISS_COLORS.items():
        col = f"prefix_cache_miss_{cause}"
        if col in df:
            fig.add_trace(go.Scatter(x=df["step"], y=df[col], stackgroup="t",
                                     name=f"miss: {cause}",
                                     hovertemplate=f"step %{{x}}: %{{y}} tokens missed "
                                                   f"({MISS_HELP[cause]})<extra></extra>",
                                     line=dict(color=color, width=0.5)))
    if "prefix_cache_resumed_queries" in df and df["prefix_cache_resumed_queries"].max():
        resumed = {"prefix_cache_resumed_hits": df["prefix_cache_resumed_hits"].fillna(0)}
        resumed["prefix_cache_resumed_misses"] = (df["prefix_cache_resumed_queries"].fillna(0)
                                                  - resumed["prefix_cache_resumed_hits"])
        for col, name, color, help_text in RESUMED:
            fig.add_trace(go.Scatter(x=df["step"], y=resumed[col], stackgroup="t", name=name,
                                     hovertemplate=f"step %{{x}}: %{{y}} {help_text}"
                                                   "<extra></extra>",
                                     line=dict(color=color, width=0.5)))
    base_layout(fig, title=title, height=300, legend_lines=2)
    fig.update_xaxes(title_text="engine step")
    fig.update_yaxes(title_text="prompt tokens (cumulative)", rangemode="tozero")
    return fig


def resumed_caption(m: dict[str, Any]) -> str:
    """One line on the lookups of resumed requests (``m``: the latest metrics)."""
    q = m.get("prefix_cache_resumed_queries") or 0
    if not q:
        return ("Hit rate and misses count first admissions only. No preempted request "
                "has been resumed yet.")
    hits = m.get("prefix_cache_resumed_hits") or 0
    return (f"Recomputed after preemption: {q - hits} tokens ({hits} of the {q} tokens that "
            "resumed requests looked up again were still cached). Like vLLM, the hit rate "
            "leaves these lookups out.")

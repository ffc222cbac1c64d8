"""Figures of the Attached view: a foreign engine's prefix cache from its hash-only stream.

- ``prefix_tree_figure``: the trie of cached blocks by parent hash (an icicle: each
  box a block, its children the blocks cached after it), labelled with the block's
  text when a tokenizer is known, coloured by age;
- ``per_pod_lines``: one figure, one line per pod, of any per-step column
  (cached blocks, scraped usage or hit rate);
- ``rates_figure``: stored and removed blocks per second;
- ``residency_figure``: a histogram of block lifetimes / idle-before-evict / reuse gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import plotly.graph_objects as go

from dashboard import palette
from dashboard.figures.style import base_layout, empty_figure
from engine.events.folds.prefix_tree import PrefixTree

MAX_TREE_NODES = 1500  # an icicle past this is unreadable and slow; the biggest subtrees are kept
POD_COLORS = ("#3B82F6", "#F97316", "#22C55E", "#8B5CF6", "#EF4444", "#0EA5E9", "#EAB308", "#64748B")


def pod_color(i: int) -> str:
    return POD_COLORS[i % len(POD_COLORS)]


def block_label(tokens: tuple[int, ...], token_text: Callable[[list[int]], str] | None,
                width: int = 24) -> str:
    if token_text is None:
        return " ".join(map(str, tokens[:6])) + (" …" if len(tokens) > 6 else "")
    text = token_text(list(tokens)).replace("\n", "⏎")
    return text if len(text) <= width else text[:width - 1] + "…"


def tree_nodes(tree: PrefixTree, limit: int = MAX_TREE_NODES) -> list[str]:
    """The hashes drawn: whole subtrees, biggest roots first, breadth first, up to ``limit``."""
    out: list[str] = []
    queue = sorted(tree.roots, key=lambda h: -tree.size.get(h, 1))
    i = 0
    while i < len(queue) and len(out) < limit:
        h = queue[i]
        i += 1
        out.append(h)
        queue.extend(tree.children.get(h, ()))
    return out


def prefix_tree_figure(tree: PrefixTree, token_text: Callable[[list[int]], str] | None,
                       now_ts: float | None, height: int = 520, path: Sequence[str] = ()) -> go.Figure:
    """The pod's cached blocks as an icicle; ``path`` (a located prompt's cached prefix) outlined."""
    title = f"Prefix tree of pod {tree.pod.pod}: cached blocks by parent hash"
    on_path = set(path)
    if not tree.blocks:
        return empty_figure(title, "Nothing cached on this pod (yet).", height=260)
    nodes = tree_nodes(tree)
    shown = set(nodes)
    root_id = f"pod {tree.pod.pod}"
    ids, parents, labels, colors, hovers = [root_id], [""], [root_id], [0.0], [""]
    values = [sum(tree.size.get(r, 1) for r in tree.roots if r in shown)]
    for h in nodes:
        b = tree.blocks[h]
        parent = b.parent if b.parent in shown else root_id
        age = None if now_ts is None else max(0.0, now_ts - b.stored_ts)
        ids.append(h)
        parents.append(parent)
        labels.append(block_label(b.token_ids, token_text))
        colors.append(age or 0.0)
        values.append(tree.size.get(h, 1))  # its whole subtree: widths are block counts
        orphan = b.parent is not None and b.parent not in tree.blocks
        text = (token_text(list(b.token_ids)) if token_text else str(list(b.token_ids)))[:200]
        hovers.append(f"hash {h}<br>parent {b.parent or '(none: a prompt start)'}"
                      f"{' (not cached: evicted or before the attach)' if orphan else ''}<br>"
                      f"{b.num_tokens} tokens: {text}<br>"
                      f"age {'?' if age is None else f'{age:.1f} s'} · reused {b.reuses}x · "
                      f"{tree.size.get(h, 1) - 1} blocks below · {b.medium or 'medium ?'}"
                      + ("<br><b>on the located prompt's cached prefix</b>" if h in on_path else ""))
    colors[0] = sum(colors[1:]) / max(1, len(colors) - 1)  # the pod box: no age of its own
    fig = go.Figure(go.Icicle(
        ids=ids, parents=parents, labels=labels, values=values, branchvalues="total",
        hovertext=hovers, hoverinfo="text", tiling=dict(orientation="v"), maxdepth=12,
        marker=dict(colors=colors, colorscale="Tealgrn_r", showscale=True,
                    colorbar=dict(title="age (s)", thickness=12),
                    line=dict(color=[palette.CHANGED if i in on_path else "#FFFFFF" for i in ids],
                              width=[4 if i in on_path else 1 for i in ids])),
        textinfo="label"))
    base_layout(fig, title=title, height=height, top=40)
    fig.update_layout(showlegend=False, margin=dict(l=8, r=8, t=40, b=8))
    if len(nodes) < len(tree.blocks):
        fig.add_annotation(text=f"showing {len(nodes)} of {len(tree.blocks)} blocks (biggest "
                                f"subtrees first)", showarrow=False, x=1, y=1.06, xref="paper",
                           yref="paper", xanchor="right", font=dict(size=11, color="#64748B"))
    return fig


def per_pod_lines(df: pd.DataFrame, column: str, title: str, y_title: str, *,
                  percent: bool = False, marker: int | None = None, empty: str = "",
                  height: int = 280) -> go.Figure:
    if df.empty or column not in df or df[column].isna().all():
        return empty_figure(title, empty or "No data yet.")
    fig = go.Figure()
    for i, (pod, g) in enumerate(df.groupby("pod", sort=False)):
        g = g.dropna(subset=[column])
        y = g[column] * 100 if percent else g[column]
        fig.add_trace(go.Scatter(x=g["step"], y=y, name=str(pod), mode="lines",
                                 line=dict(color=pod_color(i), width=2, shape="hv")))
    if marker is not None:
        fig.add_vline(x=marker, line=dict(color=palette.CHANGED, width=1, dash="dot"))
    base_layout(fig, title=title, height=height)
    fig.update_xaxes(title_text="step (one per received batch)")
    fig.update_yaxes(title_text=y_title, rangemode="tozero")
    if percent:
        fig.update_yaxes(range=[-2, 102])
    return fig


def rates_figure(df: pd.DataFrame, height: int = 280) -> go.Figure:
    title = "Blocks stored and removed per second"
    if df.empty:
        return empty_figure(title, "No batches yet.")
    fig = go.Figure()
    for i, (pod, g) in enumerate(df.groupby("pod", sort=False)):
        c = pod_color(i)
        fig.add_trace(go.Bar(x=g["t"], y=g["stored_per_s"], name=f"{pod}: stored", marker_color=c))
        fig.add_trace(go.Bar(x=g["t"], y=-g["removed_per_s"], name=f"{pod}: removed (below 0)",
                             marker_color=c, opacity=0.45))
    base_layout(fig, title=title, height=height)
    fig.update_layout(barmode="relative")
    fig.update_xaxes(title_text="seconds since the attach")
    fig.update_yaxes(title_text="blocks / s (removed below 0)")
    return fig


def residency_figure(samples: dict[str, list[float]], title: str, empty: str,
                     height: int = 260) -> go.Figure:
    """``samples``: pod -> seconds."""
    if not any(samples.values()):
        return empty_figure(title, empty, height=height)
    fig = go.Figure()
    for i, (pod, values) in enumerate(samples.items()):
        if values:
            fig.add_trace(go.Histogram(x=values, name=f"{pod} ({len(values)})", opacity=0.75,
                                       marker_color=pod_color(i), nbinsx=40))
    base_layout(fig, title=title, height=height)
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text="seconds")
    fig.update_yaxes(title_text="blocks")
    return fig

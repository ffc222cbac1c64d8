"""Per-request block tables: logical block i → physical block id, with fill.

Each request is one row; logical block i is a bar segment from i to i+1. A
partial last block is drawn only as long as its filled share, inside a dashed
outline of the whole block, so internal fragmentation is visible per request.

Every segment shows its physical block id: the font is sized from the width a
block gets (and plotly shrinks a label further rather than hide it), because the
ids are the point (which forks still share block 7, which got a copy). Forks sit
right under their parent, so one column compares the samples' tables.
"""

from __future__ import annotations

from typing import Any

from engine.events.folds.pool_snapshot import PoolSnapshot

import plotly.graph_objects as go

from dashboard import palette
from dashboard.blocks import request_rows
from dashboard.figures.style import base_layout, empty_figure

ROW_PX = 24  # one request row; readable ids at 1280 px wide
PLOT_PX = 560  # the bars' width at 1280 px with the sidebar and the row labels (measured)
MIN_PLOT_ROWS = 3  # a plot at least this tall, so one or two rows still get a full bar


def _label(row: dict[str, Any]) -> str:
    if row["parent_id"]:
        return f"  ↳ {row['request_id']} (fork of {row['parent_id']}) · {row['status']}"
    return f"{row['request_id']} · {row['status']}"


def family_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with each request's forks right after it (then the next family)."""
    kids: dict[str, list[dict[str, Any]]] = {}
    ids = {r["request_id"] for r in rows}
    for r in rows:
        if r["parent_id"] in ids:
            kids.setdefault(r["parent_id"], []).append(r)
    out: list[dict[str, Any]] = []

    def add(r: dict[str, Any]) -> None:
        out.append(r)
        for k in kids.get(r["request_id"], []):
            add(k)

    for r in rows:
        if r["parent_id"] not in ids:
            add(r)
    return out


def id_font_px(num_columns: float, max_id: int) -> int:
    """A label size that fits a block id in one segment (6..12 px)."""
    digits = len(str(max(max_id, 0)))
    per_block = PLOT_PX / max(num_columns, 1)
    return int(max(6, min(12, per_block * 0.85 / (0.6 * digits))))


def tables_figure(snapshot: PoolSnapshot, max_rows: int = 64) -> go.Figure:
    """Horizontal segmented bars, one row per request (arrival order, top first)."""
    rows = family_order(request_rows(snapshot))[:max_rows]
    title = (f"Block tables at step {snapshot.step}: logical block → physical block id "
             f"(x in blocks of {snapshot.block_size} token slots)")
    if not rows:
        return empty_figure(title, "No requests in the engine. Submit one on the Submit page.")
    bs = snapshot.block_size
    seg: dict[str, dict[str, list]] = {s: {"x": [], "base": [], "y": [], "text": [], "hover": []}
                                       for s in (palette.USED, palette.SHARED)}
    outline = {"x": [], "base": [], "y": [], "hover": []}
    labels = []
    for r in rows:
        y = _label(r)
        labels.append(y)
        for i, (b, fill, st) in enumerate(zip(r["table"], r["fills"], r["states"])):
            s = seg[st]
            s["x"].append(max(fill, 0.15 * bs) / bs)  # an empty new block stays visible
            s["base"].append(i)
            s["y"].append(y)
            s["text"].append(str(b))
            s["hover"].append(f"{r['request_id']}: logical {i} → physical {b}<br>"
                              f"{fill}/{bs} slots filled · {palette.BLOCK_LABELS[st]}")
            if fill < bs:
                outline["x"].append(1)
                outline["base"].append(i)
                outline["y"].append(y)
                outline["hover"].append(f"{r['request_id']}: block {b} has {bs - fill} of "
                                        f"{bs} slots still empty (internal fragmentation)")
    longest = max((len(r["table"]) for r in rows), default=1)
    columns = max(longest, 4) + 0.2
    font = id_font_px(columns, max((max(r["table"], default=0) for r in rows), default=0))
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=outline["x"], base=outline["base"], y=outline["y"], orientation="h",
        name="unfilled slots of a partial block", hovertext=outline["hover"],
        hoverinfo="text", marker=dict(color="rgba(0,0,0,0)",
                                      line=dict(color="#64748B", width=1.2)),
        marker_pattern=dict(shape="/", fgcolor="#CBD5E1", size=6)))
    for st, s in seg.items():
        fig.add_trace(go.Bar(
            x=s["x"], base=s["base"], y=s["y"], orientation="h", text=s["text"],
            textposition="inside", insidetextanchor="middle", textfont=dict(size=font),
            textangle=0, constraintext="inside",
            hovertext=s["hover"], hoverinfo="text", name=palette.BLOCK_LABELS[st],
            marker=dict(color=palette.BLOCK_COLORS[st], line=dict(color="white", width=1))))
    base_layout(fig, title=title, height=110 + ROW_PX * max(len(rows), MIN_PLOT_ROWS))
    # no uniformtext "hide": a label that does not fit shrinks, it never disappears
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_xaxes(title_text="logical block index (1 unit = one block)",
                     range=[0, columns], dtick=1 if longest <= 24 else 4)
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed",
                     title_text="request · status")
    return fig

"""The block pool grid: every physical block as one cell of a single heatmap.

One heatmap (plus one overlay trace for last-step changes) instead of a widget
per block keeps a 1024-block pool cheap enough to redraw twice a second
(tests/dashboard/test_grid_perf.py measures it).
"""

from __future__ import annotations

import math
from typing import Any

from engine.events.folds.pool_snapshot import PoolSnapshot

import numpy as np
import plotly.graph_objects as go

from dashboard import palette
from dashboard.blocks import GridData, grid_data
from dashboard.figures.style import legend_swatch, base_layout

_CODE = {s: i for i, s in enumerate(palette.BLOCK_STATES)}
PLOT_WIDTH_PX = 730  # plot area at 1280 px with the sidebar open (measured); sizes the cells


def _colorscale() -> list[list[Any]]:
    """A stepped scale: code k (0..3) maps to exactly one state colour."""
    n = len(palette.BLOCK_STATES)
    scale = []
    for k, s in enumerate(palette.BLOCK_STATES):
        scale += [[k / n, palette.BLOCK_COLORS[s]], [(k + 1) / n, palette.BLOCK_COLORS[s]]]
    return scale


def grid_columns(num_blocks: int) -> int:
    """Cells per row: a power of two (ids stay countable) that keeps the grid wide."""
    if num_blocks <= 64:
        return 16
    if num_blocks <= 512:
        return 32
    return 64


def grid_figure(snapshot: PoolSnapshot, events=(), *, data: GridData | None = None,
                token_text: Any = None, title: str | None = None) -> go.Figure:
    """Heatmap of the pool; outlined cells changed in the last step."""
    d = data or grid_data(snapshot, events, token_text)
    n = snapshot.num_blocks
    cols = grid_columns(n)
    rows = math.ceil(n / cols)
    # numpy arrays: plotly validates nested lists element by element (slow at 1024 cells)
    z = np.full(rows * cols, np.nan)
    z[:n] = [_CODE[s] for s in d.states]
    text = np.empty(rows * cols, dtype=object)
    text[:n] = d.hover
    text[n:] = ""
    z, text = z.reshape(rows, cols), text.reshape(rows, cols)
    fig = go.Figure(go.Heatmap(
        z=z, text=text, hovertemplate="%{text}<extra></extra>", colorscale=_colorscale(),
        zmin=-0.5, zmax=len(palette.BLOCK_STATES) - 0.5, showscale=False, xgap=1, ygap=1,
        hoverongaps=False, name="blocks"))
    for s in palette.BLOCK_STATES:  # heatmaps have no categorical legend: add swatches
        fig.add_trace(legend_swatch(f"{palette.BLOCK_LABELS[s]}: {d.counts[s]}", palette.BLOCK_COLORS[s]))
    ids = sorted(d.changed)
    cell_px = PLOT_WIDTH_PX / cols
    fig.add_trace(go.Scatter(  # x=[None] keeps the legend entry when nothing changed
        x=[i % cols for i in ids] or [None], y=[i // cols for i in ids] or [None],
        mode="markers", marker=dict(symbol="square-open", size=max(5, cell_px * 0.8),
                                    color=palette.CHANGED, line=dict(width=2, color=palette.CHANGED)),
        name=f"changed in the last step: {len(ids)}", hoverinfo="skip", showlegend=True))
    base_layout(fig, title=title or f"Block pool at step {snapshot.step}: "
                f"{n} blocks × {snapshot.block_size} token slots",
                height=int(max(3, rows) * cell_px) + 150)
    tick_rows = list(range(0, rows, max(1, rows // 8)))
    fig.update_xaxes(title_text="block id = row's first id + column", range=[-0.5, cols - 0.5],
                     showgrid=False, zeroline=False, dtick=8 if cols >= 32 else 4,
                     constrain="domain")
    # square cells: one block reads as one unit of memory, whatever the pool shape
    fig.update_yaxes(title_text="row's first block id", autorange="reversed", showgrid=False,
                     zeroline=False, tickmode="array", tickvals=tick_rows,
                     ticktext=[str(r * cols) for r in tick_rows], scaleanchor="x",
                     scaleratio=1, constrain="domain", constraintoward="top")
    return fig

"""The run view shared by Live and Replay: KPIs, block grid, then one panel per tab.

Tabs are lazy (``on_change="rerun"``): only the open tab's figures are built,
which keeps a live refresh of a big pool well under the refresh period.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import contiguous
from dashboard.blocks import grid_data
from dashboard.event_log import event_rows, step_summary
from dashboard.figures import fragmentation
from dashboard.figures.grid import grid_figure
from dashboard.figures.latency import latency_figure
from dashboard.figures.prefix import hit_rate_figure, misses_figure, resumed_caption
from dashboard.figures.scheduler import budget_figure, queues_figure
from dashboard.figures.tables import tables_figure
from dashboard.figures.timeline import events_figure
from dashboard.frame import RunFrame
from dashboard.history import latency_samples, latest, metrics_frame

TABS = ("Block tables", "Fragmentation", "Prefix cache", "Evictions & copy-on-write",
        "Scheduler", "Latency", "Event log")
LIVE_WINDOW = 400  # steps kept in live time series: enough context, bounded redraw cost
PLOT_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def kpis(frame: RunFrame) -> None:
    """One row of headline numbers for the shown step."""
    m = latest(frame.history)
    snap = frame.snapshot
    pool = snap.summary()
    cols = st.columns(8)
    # short labels so eight fit one row at 1280 px; the help says what each one is
    cols[0].metric("step", frame.step, help="engine step shown")
    cols[1].metric("blocks used", f"{pool.num_used_blocks}/{snap.num_blocks}",
                   help="kv_cache_usage: blocks with ref count > 0 / all blocks")
    cols[2].metric("slots filled", _pct(m.get("kv_token_usage")),
                   help="kv_token_usage: filled token slots / all token slots")
    cols[3].metric("int. frag.", _pct(m.get("internal_fragmentation")),
                   help="internal fragmentation: empty slots of referenced blocks "
                        "(partial last blocks) / their slots")
    cols[4].metric("hit rate", _pct(m.get("prefix_cache_hit_rate")),
                   help="prefix cache: prompt tokens found cached / looked up at first "
                        "admission (this run; lookups after a preemption are counted apart)")
    cols[5].metric("run · wait", f"{pool.num_requests_running} · "
                   f"{pool.num_requests_waiting + pool.num_requests_preempted}",
                   help="requests running · waiting (incl. preempted)")
    cols[6].metric("evict · CoW", f"{m.get('num_evictions', 0)} · {m.get('cow_copies', 0)}",
                   help="cached blocks evicted for reuse (LRU) · copy-on-write copies, this run")
    tps = m.get("output_throughput_tps")
    cols[7].metric("tokens/s", "–" if tps is None else f"{tps:.1f}",
                   help="output tokens per second over the last 10 s")


def _baselines(frame: RunFrame, max_age_s: float) -> contiguous.Baselines | None:
    """Contiguous what-if for the frame's run, cached per run; recomputed when the run
    grew and the cached one is older than ``max_age_s`` (live) — replay passes inf."""
    if not frame.records:
        return None
    cache = st.session_state.setdefault("_baselines", {})
    hit = cache.get(frame.source)
    n = len(frame.records)
    if hit and hit["key"] == frame.key and (hit["n"] == n or time.time() - hit["t"] < max_age_s):
        return hit["value"]
    cfg_bs, cfg_nb = frame.snapshot.block_size, frame.snapshot.num_blocks
    value = contiguous.baselines(frame.records, frame.history, cfg_nb, cfg_bs, frame.max_model_len,
                        frame.max_tokens)
    cache[frame.source] = {"key": frame.key, "n": n, "t": time.time(), "value": value}
    return value


def _fragmentation(frame: RunFrame, df: pd.DataFrame, marker: int | None) -> None:
    base = _baselines(frame, max_age_s=3.0 if frame.source == "live" else float("inf"))
    snap = frame.snapshot
    cap = snap.num_blocks * snap.block_size
    st.plotly_chart(fragmentation.split_figure(contiguous.split_now(snap, base), cap, frame.step),
                    config=PLOT_CONFIG, key=f"{frame.source}_split")
    left, right = st.columns(2)
    left.plotly_chart(fragmentation.usage_figure(df, marker), config=PLOT_CONFIG,
                      key=f"{frame.source}_usage")
    right.plotly_chart(fragmentation.concurrency_figure(base, marker), config=PLOT_CONFIG,
                       key=f"{frame.source}_concurrency")
    if base is not None:
        st.caption(f"Whole run, same arrivals on {cap} token slots (max_model_len "
                   f"{frame.max_model_len}). Contiguous allocators reserve a region per "
                   "request up front; paging reserves one block at a time.")
        st.dataframe(pd.DataFrame(contiguous.summary_table(base)), hide_index=True,
                     width="stretch")
    else:
        st.caption("The run-level contiguous comparison needs the run's events; "
                   "it appears once steps arrive.")


def render_tabs(frame: RunFrame, df: pd.DataFrame, marker: int | None = None) -> None:
    """The lazy tab strip; only the open tab is computed."""
    tabs = st.tabs(TABS, key=f"{frame.source}_tabs", on_change="rerun")
    panels = dict(zip(TABS, tabs))
    snap = frame.snapshot

    def is_open(name: str) -> bool:
        return panels[name].open is not False  # None (no state tracking): draw everything

    with panels["Block tables"]:
        if is_open("Block tables"):
            n = len(snap.requests)
            with st.container(height=min(560, 120 + 24 * max(n, 1))):
                st.plotly_chart(tables_figure(snap), config=PLOT_CONFIG,
                                key=f"{frame.source}_tables")
    with panels["Fragmentation"]:
        if is_open("Fragmentation"):
            _fragmentation(frame, df, marker)
    with panels["Prefix cache"]:
        if is_open("Prefix cache"):
            left, right = st.columns(2)
            left.plotly_chart(hit_rate_figure(df), config=PLOT_CONFIG,
                              key=f"{frame.source}_hits")
            right.plotly_chart(misses_figure(df), config=PLOT_CONFIG,
                               key=f"{frame.source}_misses")
            st.caption(resumed_caption(latest(frame.history)))
    with panels["Evictions & copy-on-write"]:
        if is_open("Evictions & copy-on-write"):
            st.plotly_chart(events_figure(df, marker), config=PLOT_CONFIG,
                            key=f"{frame.source}_events")
    with panels["Scheduler"]:
        if is_open("Scheduler"):
            st.plotly_chart(budget_figure(df), config=PLOT_CONFIG,
                            key=f"{frame.source}_budget")
            st.plotly_chart(queues_figure(df), config=PLOT_CONFIG,
                            key=f"{frame.source}_queues")
    with panels["Latency"]:
        if is_open("Latency"):
            st.plotly_chart(latency_figure(latency_samples(frame.history),
                                           latest(frame.history)),
                            config=PLOT_CONFIG, key=f"{frame.source}_latency")
    with panels["Event log"]:
        if is_open("Event log"):
            rows = event_rows(frame.events)
            st.caption(f"Events of step {frame.step}, in the order the engine emitted them.")
            if rows:
                st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                             height=min(420, 40 + 35 * len(rows)))
            else:
                st.info("This step emitted no events.")


def render_run_view(frame: RunFrame, marker: int | None = None,
                    timeline: list[dict[str, Any]] | None = None) -> None:
    """KPIs, the pool grid with last-step highlights, and the tabbed panels.

    ``timeline``: metrics drawn over time (Replay passes the whole run and marks the
    shown step with ``marker``); default: the frame's history."""
    kpis(frame)
    data = grid_data(frame.snapshot, frame.events, frame.token_text)
    st.plotly_chart(grid_figure(frame.snapshot, data=data), config=PLOT_CONFIG,
                    key=f"{frame.source}_grid")
    st.caption(f"Step {frame.step}: {step_summary(frame.events)}. Red outlines mark blocks "
               "this step touched; hover a block for its owners, ref count, hash and tokens.")
    window = LIVE_WINDOW if frame.source == "live" else None
    render_tabs(frame, metrics_frame(timeline if timeline is not None else frame.history,
                                     window), marker)

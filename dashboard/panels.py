"""The run view shared by Live and Replay: KPIs, block grid, then one panel per tab.

A frame is drawn in two phases: ``build_run_view`` computes every figure, table and
text of the frame first (all from the one step the frame holds), then ``draw`` only
hands the finished objects to Streamlit. So the browser never shows a new KPI row
above an old grid while the figures of a slow frame are still being built.

Tabs are lazy (``on_change="rerun"``): only the open tab's figures are built (the
open tab's label is in session state under the tab strip's key), which keeps a live
refresh of a big pool well under the refresh period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
from dashboard.history import latency_samples, metrics_frame

TABS = ("Block tables", "Fragmentation", "Prefix cache", "Evictions & copy-on-write",
        "Scheduler", "Latency", "Event log")
LIVE_WINDOW = 400  # steps kept in live time series: enough context, bounded redraw cost
PLOT_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "select2d"]}

Draw = Callable[[], Any]  # one Streamlit call with everything it shows already built


def _pct(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


@dataclass(slots=True)
class RunView:
    """A frame's finished parts: KPI tuples, the grid, the caption, the open tab's draws."""

    step: int
    kpis: list[tuple[str, Any, str, str | None]]  # label, value, help, delta
    grid: Any
    caption: str
    open_tab: str
    tab_draws: list[Draw] = field(default_factory=list)


def kpi_values(frame: RunFrame) -> list[tuple[str, Any, str, str | None]]:
    """One row of headline numbers for the shown step: (label, value, help, delta)."""
    m = frame.metrics
    snap = frame.snapshot
    pool = snap.summary()
    resets = m.get("num_reset_evictions") or 0
    tps = m.get("output_throughput_tps")
    # short labels so eight fit one row at 1280 px; the help says what each one is
    return [
        ("step", frame.step, "engine step shown", None),
        ("blocks used", f"{pool.num_used_blocks}/{snap.num_blocks}",
         "kv_cache_usage (vLLM's kv_cache_usage_perc): blocks with ref count > 0 / all "
         "blocks; a block holding one token counts as a full one",
         _pct(pool.num_used_blocks / snap.num_blocks)),  # a short delta: the row is narrow
        ("slots filled", _pct(m.get("kv_token_usage")),
         "kv_token_usage: filled token slots / all token slots (kvscope_kv_token_usage), "
         "the token occupancy beside the block usage on its left (vLLM PR #57336)",
         f"{pool.num_filled_slots} tokens"),
        ("int. frag.", _pct(m.get("internal_fragmentation")),
         "internal fragmentation: empty slots of referenced blocks (partial last blocks) / "
         "their slots", None),
        ("hit rate", _pct(m.get("prefix_cache_hit_rate")),
         "prefix cache: prompt tokens found cached / looked up at first admission (this "
         "run; lookups after a preemption are counted apart)", None),
        ("run · wait", f"{pool.num_requests_running} · "
         f"{pool.num_requests_waiting + pool.num_requests_preempted}",
         "requests running · waiting (incl. preempted)", None),
        ("evict · CoW", f"{m.get('num_evictions', 0)} · {m.get('cow_copies', 0)}",
         "cached blocks evicted for reuse (LRU) · copy-on-write copies, this run. Hashes "
         "dropped by a prefix-cache reset are counted apart (below the number).",
         f"{resets} dropped by reset" if resets else None),
        ("tokens/s", "–" if tps is None else f"{tps:.1f}",
         "output tokens per second over the last 10 s", None),
    ]


def _baselines(frame: RunFrame) -> contiguous.Baselines | None:
    """The contiguous what-if of the frame's schedule, cached per run and last step."""
    if frame.schedule is None or frame.schedule.last_step is None:
        return None
    cache = st.session_state.setdefault("_baselines", {})
    key = (frame.key, frame.schedule.last_step, len(frame.schedule.requests))
    hit = cache.get(frame.source)
    if hit and hit[0] == key:
        return hit[1]
    snap = frame.snapshot
    history = frame.schedule_history if frame.schedule_history is not None else frame.history
    value = contiguous.baselines(frame.schedule, history, snap.num_blocks, snap.block_size,
                                 frame.max_model_len)
    cache[frame.source] = (key, value)
    return value


BASELINE_RULE = (
    "What the contiguous rows replay: this run's own schedule (every request's steps, "
    "as the paged scheduler decided them), on the same token slots. A request may start "
    "only once one contiguous free region of its reservation exists, and every later "
    "start waits at least as long (first come, first served), so the schedule shifts "
    "later; while everything fits, both sides show the same requests running at every "
    "step.")


def _fragmentation(frame: RunFrame, df: pd.DataFrame, marker: int | None) -> list[Draw]:
    base = _baselines(frame)
    snap = frame.snapshot
    cap = snap.num_blocks * snap.block_size
    src = frame.source
    split = fragmentation.split_figure(contiguous.split_now(snap, base), cap, frame.step)
    usage = fragmentation.usage_figure(df, marker)
    conc = fragmentation.concurrency_figure(base, marker)
    draws: list[Draw] = [lambda: st.plotly_chart(split, config=PLOT_CONFIG, key=f"{src}_split")]

    def two() -> None:
        left, right = st.columns(2)
        left.plotly_chart(usage, config=PLOT_CONFIG, key=f"{src}_usage")
        right.plotly_chart(conc, config=PLOT_CONFIG, key=f"{src}_concurrency")

    draws.append(two)
    if base is None:
        draws.append(lambda: st.caption(
            "The run-level contiguous comparison needs the run's steps; it appears once "
            "they arrive."))
        return draws
    table = pd.DataFrame(contiguous.summary_frame(base)).astype(str)
    caption = (f"Whole run so far, on {cap} token slots (max_model_len {frame.max_model_len})"
               f". {BASELINE_RULE}")
    draws.append(lambda: st.caption(caption))
    draws.append(lambda: st.dataframe(table, hide_index=True, width="stretch",
                                      row_height=32, height=38 + 32 * len(table)))
    return draws


def _tab_draws(frame: RunFrame, name: str, df: pd.DataFrame, marker: int | None) -> list[Draw]:
    """Build the open tab's parts (figures now; the returned calls only show them)."""
    src, snap = frame.source, frame.snapshot
    if name == "Block tables":
        fig = tables_figure(snap)
        height = min(560, int(fig.layout.height or 200) + 10)

        def tables() -> None:
            with st.container(height=height, border=False):
                st.plotly_chart(fig, config=PLOT_CONFIG, key=f"{src}_tables")

        return [tables]
    if name == "Fragmentation":
        return _fragmentation(frame, df, marker)
    if name == "Prefix cache":
        hits, misses = hit_rate_figure(df), misses_figure(df)
        note = resumed_caption(frame.metrics)

        def prefix() -> None:
            left, right = st.columns(2)
            left.plotly_chart(hits, config=PLOT_CONFIG, key=f"{src}_hits")
            right.plotly_chart(misses, config=PLOT_CONFIG, key=f"{src}_misses")
            st.caption(note)

        return [prefix]
    if name == "Evictions & copy-on-write":
        fig = events_figure(df, marker)
        return [lambda: st.plotly_chart(fig, config=PLOT_CONFIG, key=f"{src}_events")]
    if name == "Scheduler":
        budget, queues = budget_figure(df), queues_figure(df)
        return [lambda: st.plotly_chart(budget, config=PLOT_CONFIG, key=f"{src}_budget"),
                lambda: st.plotly_chart(queues, config=PLOT_CONFIG, key=f"{src}_queues")]
    if name == "Latency":
        fig = latency_figure(latency_samples(frame.history), frame.metrics)
        return [lambda: st.plotly_chart(fig, config=PLOT_CONFIG, key=f"{src}_latency")]
    rows = event_rows(frame.events)
    if not frame.events_known:
        return [lambda: st.info(f"The events of step {frame.step} did not reach this "
                                "view (it re-based on a snapshot).")]
    if not rows:
        return [lambda: st.info("This step emitted no events.")]
    table = pd.DataFrame(rows)
    return [lambda: st.caption(f"Events of step {frame.step}, in the order the engine "
                               "emitted them."),
            lambda: st.dataframe(table, hide_index=True, width="stretch",
                                 height=min(420, 40 + 35 * len(rows)))]


def open_tab(source: str) -> str:
    """The tab the strip under ``{source}_tabs`` shows (the first before any choice)."""
    name = st.session_state.get(f"{source}_tabs")
    return name if name in TABS else TABS[0]


def build_run_view(frame: RunFrame, marker: int | None = None,
                   timeline: list[dict[str, Any]] | None = None) -> RunView:
    """Every part of the frame, built from its one step.

    ``timeline``: metrics drawn over time (Replay passes the whole run and marks the
    shown step with ``marker``); default: the frame's history."""
    data = grid_data(frame.snapshot, frame.events, frame.token_text)
    grid = grid_figure(frame.snapshot, data=data)
    changes = (step_summary(frame.events) if frame.events_known
               else "its events did not reach this view")
    caption = (f"Step {frame.step}: {changes}. Red outlines mark blocks this step "
               "touched; hover a block for its owners, ref count, hash and tokens.")
    window = LIVE_WINDOW if frame.source == "live" else None
    df = metrics_frame(timeline if timeline is not None else frame.history, window)
    name = open_tab(frame.source)
    return RunView(frame.step, kpi_values(frame), grid, caption, name,
                   _tab_draws(frame, name, df, marker))


def draw(view: RunView, source: str) -> None:
    """Hand the built parts to Streamlit (fast: nothing is computed here)."""
    cols = st.columns(len(view.kpis))
    for col, (label, value, help_, delta) in zip(cols, view.kpis):
        col.metric(label, value, delta=delta, delta_color="off", delta_arrow="off", help=help_)
    st.plotly_chart(view.grid, config=PLOT_CONFIG, key=f"{source}_grid")
    st.caption(view.caption)
    tabs = st.tabs(TABS, key=f"{source}_tabs", on_change="rerun")
    for name, tab in zip(TABS, tabs):
        if tab.open is False:
            continue
        with tab:
            # open is None where the strip tracks no state: only the built tab has parts
            for part in view.tab_draws if name == view.open_tab else ():
                part()


def render_run_view(frame: RunFrame, marker: int | None = None,
                    timeline: list[dict[str, Any]] | None = None) -> None:
    """KPIs, the pool grid with last-step highlights, and the tabbed panels."""
    draw(build_run_view(frame, marker, timeline), frame.source)

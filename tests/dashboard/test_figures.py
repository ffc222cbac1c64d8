"""Every figure builds from real core data, has a legend and unit-bearing axis titles."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from dashboard import palette
from dashboard.contiguous import baselines_of_records, split_now, summary_frame, summary_table
from dashboard.figures import fragmentation
from dashboard.figures.compare import PANELS, overlay_figure
from dashboard.figures.grid import grid_figure
from dashboard.figures.latency import latency_figure
from dashboard.figures.prefix import hit_rate_figure, misses_figure, resumed_caption
from dashboard.figures.scheduler import budget_figure, queues_figure
from dashboard.figures.tables import tables_figure
from dashboard.figures.timeline import events_figure
from dashboard.history import latency_samples, latest, metrics_frame
from engine.events.folds.reducer import PoolState
from tests.dashboard.fake_runs import make_records


@pytest.fixture(scope="module")
def run():
    config, records, max_tokens = make_records(num_blocks=24)  # small pool: evicts, preempts
    state = PoolState(config["num_blocks"], config["block_size"])
    mid = len(records) // 2
    for r in records[:mid + 1]:
        state.apply_step(r)
    snap = state.to_snapshot()
    return config, records, max_tokens, snap, records[mid]


def _check(fig: go.Figure) -> None:
    assert fig.layout.showlegend is not False
    assert fig.layout.title.text
    named = [t for t in fig.data if t.name]
    assert named, "every chart has legend entries"
    for ax in (fig.layout.xaxis, fig.layout.yaxis):
        if ax.visible is not False:
            assert ax.title.text, "every axis says what (and in which unit) it shows"


def test_grid_has_one_heatmap_cell_per_block_and_state_swatches(run):
    _, _, _, snap, rec = run
    fig = grid_figure(snap, rec.events)
    heat = fig.data[0]
    assert isinstance(heat, go.Heatmap)
    cells = [v for row in heat.z for v in row if v == v]  # drop NaN padding
    assert len(cells) == snap.num_blocks
    names = " ".join(t.name for t in fig.data[1:])
    for s in palette.BLOCK_STATES:
        assert palette.BLOCK_LABELS[s] in names
    assert "changed in the last step" in names
    _check(fig)


def test_time_series_figures(run):
    config, records, _, snap, rec = run
    history = [r.metrics for r in records]
    df = metrics_frame(history)
    assert len(df) == len(records) and df["step"].is_monotonic_increasing
    for fig in (hit_rate_figure(df), misses_figure(df), budget_figure(df), queues_figure(df),
                events_figure(df, rec.step), fragmentation.usage_figure(df, rec.step),
                tables_figure(snap),
                latency_figure(latency_samples(history), latest(history))):
        _check(fig)
    totals = events_figure(df).data
    assert any("preemptions (total" in t.name for t in totals)


def test_paged_vs_contiguous(run):
    config, records, max_tokens, snap, rec = run
    base = baselines_of_records(records, config["num_blocks"], config["block_size"],
                                config["max_model_len"], max_tokens)
    rows = split_now(snap, base)
    cap = config["num_blocks"] * config["block_size"]
    assert len(rows) == 3
    for r in rows:  # every slot is accounted for exactly once
        slots = sum(v for k, v in r.items() if k not in ("variant", "running", "waiting"))
        assert slots == cap, r
    table = summary_table(base)
    paged, mml = table[0], table[1]
    assert paged["allocator"].startswith("paged")
    # reserving max_model_len per request fits fewer requests than paging does
    assert mml["max running requests"] <= paged["max running requests"]
    assert mml["mean running requests"] <= paged["mean running requests"]
    shown = summary_frame(base)  # turned: one column per allocator, all of them visible
    assert [list(r)[1:] for r in shown][0] == [t["allocator"] for t in table]
    assert {r["figure"] for r in shown} == set(table[0]) - {"allocator"}
    _check(fragmentation.split_figure(rows, cap, rec.step))
    _check(fragmentation.concurrency_figure(base, rec.step))


def test_empty_inputs_give_explaining_placeholders():
    df = metrics_frame([])
    for fig in (hit_rate_figure(df), misses_figure(df), budget_figure(df), queues_figure(df),
                events_figure(df), fragmentation.usage_figure(df),
                fragmentation.concurrency_figure(None),
                latency_figure({"ttft_s": [], "itl_s": [], "e2e_s": []}, {})):
        assert fig.layout.annotations and fig.layout.annotations[0].text


def test_compare_overlay(run):
    _, records, _, _, _ = run
    df = metrics_frame([r.metrics for r in records])
    for col, title, scale in PANELS:
        fig = overlay_figure(df, df, col, title, scale)
        assert [t.name for t in fig.data] == ["run A", "run B"]
        _check(fig)


def test_prefix_panel_shows_lookups_after_preemption_apart():
    """A pool small enough to preempt: the resumed requests' lookups are their own traces,
    "recomputed after preemption" among them, and the hit rate leaves them out."""
    _, records, _ = make_records(num_blocks=20)
    history = [r.metrics for r in records]
    last = history[-1]
    q, h = last["prefix_cache_resumed_queries"], last["prefix_cache_resumed_hits"]
    assert last["num_preemptions"] > 0 and q > 0
    assert last["prefix_cache_hit_rate"] == last["prefix_cache_hits"] / last["prefix_cache_queries"]
    fig = misses_figure(metrics_frame(history))
    traces = {t.name: t for t in fig.data}
    assert list(traces["recomputed after preemption"].y)[-1] == q - h
    assert list(traces["after preemption: found cached again"].y)[-1] == h
    _check(fig)
    assert resumed_caption(last).startswith(f"Recomputed after preemption: {q - h} tokens")
    assert "No preempted request" in resumed_caption({})


def test_misses_figure_with_prefix_caching_off_shows_the_disabled_tokens():
    _, records, _ = make_records(prefix=False)
    df = metrics_frame([r.metrics for r in records])
    assert not df["prefix_cache_queries"].max()  # vLLM's counters count nothing
    fig = misses_figure(df)
    assert not fig.layout.annotations
    assert "miss: disabled" in [t.name for t in fig.data]

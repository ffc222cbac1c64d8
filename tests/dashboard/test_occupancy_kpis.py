"""The KPI row shows token occupancy beside block usage (issue 31 item 6), from the folded
pool of a run of the real core: three requests of 17, 33 and 40 tokens on 16 blocks of 16."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from dashboard.frame import RunFrame
from dashboard.panels import kpi_values
from engine.events.folds.reducer import PoolState
from tests.dashboard.fake_runs import make_records

WORK = [("a", list(range(100, 117)), 1, 4), ("b", list(range(200, 233)), 1, 4),
        ("c", list(range(300, 340)), 1, 4)]


def first_step_frame() -> RunFrame:
    config, records, _ = make_records(block_size=16, num_blocks=16, budget=128, work=WORK,
                                      arrivals_per_step=3)
    state = PoolState(16, 16)
    state.apply_step(records[0])
    return RunFrame(source="replay", key="occ", snapshot=state.to_snapshot(), events=records[0].events,
                    history=[records[0].metrics], config=config)


def test_block_usage_and_token_occupancy_side_by_side():
    kpis = {label: (value, delta) for label, value, _help, delta in kpi_values(first_step_frame())}
    # 2 + 3 + 3 blocks of 16; 17 + 33 + 40 = 90 tokens in the 256 slots
    assert kpis["blocks used"] == ("8/16", "50.0%")
    assert kpis["slots filled"] == ("35.2%", "90 tokens")
    assert kpis["int. frag."][0] == "29.7%"  # 1 - 90 / 128


def _script():
    from dashboard.panels import render_run_view
    from tests.dashboard.test_occupancy_kpis import first_step_frame

    render_run_view(first_step_frame())


def test_the_row_renders_the_deltas_without_arrows():
    at = AppTest.from_function(_script, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = {m.label: (m.value, m.proto.delta) for m in at.metric}
    assert shown["blocks used"] == ("8/16", "50.0%")
    assert shown["slots filled"] == ("35.2%", "90 tokens")
    none = type(at.metric[0].proto).MetricDirection.Value("NONE")
    assert all(m.proto.direction == none for m in at.metric)  # a fact, not a rise or a fall

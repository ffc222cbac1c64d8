"""Compare: two stored runs side by side (e.g. block_size 8 vs 32, chunked prefill on/off)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.store.runs import RunStore

from dashboard.figures.compare import PANELS, overlay_figure
from dashboard.history import metrics_frame
from dashboard.panels import PLOT_CONFIG
from dashboard.run_summary import compare_rows, config_rows, summarize_run
from dashboard.stored_runs import load_run, run_label


def page() -> None:
    st.title("Compare two runs")
    store = RunStore()
    # an attached run has no pool, scheduler or latency per step to overlay: engine runs only
    runs = [r for r in store.list_runs() if r.get("num_steps") and r.get("kind") != "attached"]
    if len(runs) < 2:
        st.info("Compare needs two stored runs with steps. Submit a preset, change a setting "
                "on the Engine page, submit it again, then come back.")
        return
    by_id = {r["id"]: r for r in runs}
    ids = list(by_id)
    left, right = st.columns(2)
    a_id = left.selectbox("Run A", ids, index=min(1, len(ids) - 1), key="compare_a",
                          format_func=lambda i: run_label(by_id[i]))
    b_id = right.selectbox("Run B", ids, index=0, key="compare_b",
                           format_func=lambda i: run_label(by_id[i]))
    if a_id == b_id:
        st.warning("Pick two different runs.")
    ra, rb = load_run(store, by_id[a_id]), load_run(store, by_id[b_id])
    settings = config_rows(ra.config, rb.config)
    changed = [f"`{r['setting']}` {r['run A']} → {r['run B']}" for r in settings if r["differs"]]
    st.caption("What differs: " + (", ".join(changed) if changed else "no engine setting "
               "(same config: compare the workloads)") + ". Same metric, same axes below.")
    ha, hb = [r.metrics for r in ra.records], [r.metrics for r in rb.records]
    da, db = metrics_frame(ha), metrics_frame(hb)
    names = (f"A: {by_id[a_id].get('label') or a_id}", f"B: {by_id[b_id].get('label') or b_id}")
    cols = st.columns(2)
    for i, (col, title, scale) in enumerate(PANELS):
        cols[i % 2].plotly_chart(overlay_figure(da, db, col, title, scale, names),
                                 config=PLOT_CONFIG, key=f"compare_{col}")
    left, right = st.columns([1.4, 1])
    with left:
        st.subheader("Key figures (whole run)")
        rows = compare_rows(summarize_run(ha, len(ra.requests)),
                            summarize_run(hb, len(rb.requests)))
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                     height=35 * (len(rows) + 1) + 3)
    with right:
        st.subheader("Engine settings")
        st.dataframe(pd.DataFrame(settings), hide_index=True, width="stretch")


page()

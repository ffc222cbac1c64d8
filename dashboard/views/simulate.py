"""Simulate: the real core on a trace (no model), one pod or a fleet; the capacity curve.

A trace is a file of data/traces, an uploaded JSONL (kvscope's request format or
Mooncake's), or a stored engine run. The sweep runs every combination of the chosen
pool sizes and routers (``engine.simulate.sweep``); the curve is hit rate against KV
memory per pod, a line per router. "Record" keeps each pod of the largest pool as a
``simulated`` run: Replay and Compare show its blocks step by step.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.core import CacheConfig, SchedulerConfig
from engine.simulate.cost import default_cost
from engine.simulate.routers import ROUTERS
from engine.simulate.simulation import SimConfig, simulate_recorded
from engine.simulate.sweep import capacity_figure, run_sweep
from engine.simulate.trace import TraceError, read_engine_run, read_jsonl
from engine.store.runs import RunStore

from dashboard.panels import PLOT_CONFIG

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
UPLOAD = "an uploaded JSONL"
STORED = "a stored engine run"


def _trace(store: RunStore):
    files = sorted(p.name for p in TRACES.glob("*.jsonl"))
    source = st.radio("Trace", files + [UPLOAD, STORED], key="sim_source", horizontal=True)
    if source == UPLOAD:
        up = st.file_uploader("JSONL: {timestamp_ms, token_ids, output_length} or Mooncake's "
                              "{timestamp, input_length, output_length, hash_ids}", type=["jsonl"], key="sim_upload")
        if up is None:
            return None
        path = Path(tempfile.mkdtemp()) / "trace.jsonl"
        path.write_bytes(up.getvalue())
        return read_jsonl(path)
    if source == STORED:
        runs = [r for r in store.list_runs() if (r.get("kind") or "engine") == "engine" and r.get("num_steps")]
        if not runs:
            st.info("No stored engine run yet: submit a preset on the Submit page first.")
            return None
        rid = st.selectbox("Run", [r["id"] for r in runs], key="sim_run",
                           format_func=lambda i: next(r.get("label") or i for r in runs if r["id"] == i))
        return read_engine_run(store, rid)
    return read_jsonl(TRACES / source)


def page() -> None:
    st.title("Simulate: what if?")
    st.caption("The engine's own scheduler and KV cache manager on a request trace, with no model: "
               "hit rates, evictions and preemptions are what kvscope serve would do; times come "
               "from a step-cost model fitted on this machine.")
    store = RunStore()
    try:
        trace = _trace(store)
    except TraceError as exc:
        st.error(str(exc))
        return
    if trace is None:
        return
    prompt = sum(r.num_prompt_tokens for r in trace.requests)
    st.write(f"**{len(trace.requests)} requests**, {prompt:,} prompt tokens ({trace.source})")
    longest = max(r.num_prompt_tokens + r.output_length for r in trace.requests)
    c1, c2, c3, c4 = st.columns(4)
    pods = c1.number_input("Pods", 1, 64, 4, key="sim_pods")
    block_size = c2.selectbox("Block size", [16, 32, 64], key="sim_block_size")
    budget = c3.number_input("Tokens per step", 64, 65536, 2048, step=256, key="sim_budget")
    seqs = c4.number_input("Max sequences", 1, 1024, 64, key="sim_seqs")
    least = -(-longest // block_size)
    sizes = st.multiselect("KV blocks per pod (the sweep)", sorted({least, 2 * least, 4 * least, 8 * least}),
                           default=[least, 2 * least, 4 * least], key="sim_blocks", accept_new_options=True)
    routers = st.multiselect("Routers", list(ROUTERS), default=["round-robin", "precise-prefix", "oracle"],
                             key="sim_routers")
    record = st.checkbox("Record the largest pool's pods as runs (Replay, Compare)", key="sim_record")
    if not st.button("Simulate", type="primary", key="sim_go") or not sizes or not routers:
        return
    try:
        blocks = sorted(int(b) for b in sizes)
        base = SimConfig(int(pods), routers[0],
                         SchedulerConfig(max_model_len=longest, max_num_batched_tokens=int(budget),
                                         max_num_seqs=int(seqs)),
                         CacheConfig(block_size=block_size, num_blocks=blocks[0]), default_cost())
        with st.spinner(f"{len(blocks) * len(routers)} simulations"):
            rows = run_sweep(trace, base, {"num_kv_blocks": blocks, "router": routers})
    except (ValueError, TraceError) as exc:
        st.error(str(exc))
        return
    st.plotly_chart(capacity_figure(rows, trace.config.get("kv_bytes_per_block")), config=PLOT_CONFIG,
                    key="sim_curve")
    frame = pd.DataFrame(rows)[["router", "num_kv_blocks", "prefix_cache_hit_rate", "reachable_hit_rate",
                                "router_loss", "num_blocks_evicted", "num_preemptions", "ttft_p50_s"]]
    pct = {c: st.column_config.NumberColumn(c.replace("_", " "), format="percent")
           for c in ("prefix_cache_hit_rate", "reachable_hit_rate", "router_loss")}
    st.dataframe(frame, hide_index=True, key="sim_table", column_config=pct)
    if record:
        cfg = SimConfig(int(pods), routers[0], base.sched,
                        CacheConfig(block_size=block_size, num_blocks=blocks[-1]), base.cost)
        result = simulate_recorded(trace, cfg, store.path, label=f"simulate {routers[0]}")
        st.success(f"Recorded {len(result.run_ids)} simulated run(s): " + ", ".join(result.run_ids)
                   + ". Open Replay to step through them.")


page()

"""Fleet: every attached pod as a row, the operator's first look at a deployment.

Live when this dashboard is connected to ``kvscope attach``; otherwise a stored attached run
(at its last step). Each row is what the attach worker put in its steps
(``engine.attach.fleet``: cached blocks, stored / removed / evicted blocks per minute, the
share evicted before any reuse, index fidelity) with the pod's scraped hit rate and usage and
the age of its latest batch (``fleet.overview``). The page only draws.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.attached_frame import AttachedFrame, fleet_rows, pod_series
from dashboard.attached_page import attached_page
from dashboard.figures.attached import per_pod_lines
from dashboard.panels import PLOT_CONFIG
from engine.attach.fleet import QUIET_ALERT_S, fleet_placement, overview


def _pct(v) -> str:
    return "–" if v is None or v != v else f"{100 * v:.1f}%"


def _age(v) -> str:
    return "–" if v is None else f"{v:.0f} s" if v >= 10 else f"{v:.1f} s"


def render_fleet(frame: AttachedFrame, now_wall: float, live: bool) -> None:
    """The table, what to look at, and cached blocks over time."""
    raw = fleet_rows(frame)
    rows = overview(raw, now_wall)
    if not rows:
        st.info("No fleet figures yet: they ride on the attach worker's steps (a run recorded "
                "before the fleet microscope has none).")
        return
    table = pd.DataFrame([{
        "pod": r["pod"], "cached blocks": r["cached_blocks"], "last event": _age(r["last_event_age_s"]),
        "index completeness": _pct(r["completeness"]),
        "hit rate": _pct(r["hit_rate"]), "KV usage": _pct(r["kv_usage"]),
        "hit (events)": _pct(r["achieved_hit_rate"]), "reachable (events)": _pct(r["reachable_hit_rate"]),
        "stored /min": round(r["stored_per_min"], 1), "removed /min": round(r["removed_per_min"], 1),
        "evicted /min": round(r["evicted_per_min"], 1),
        "evicted before reuse": _pct(r["evicted_before_reuse_share"]),
        "gaps unfilled": r["gaps_unfilled"], "restarts": r["restarts"],
        "look at": "; ".join(r["alerts"]) or "–", "dialect": r["dialect"] or "–"} for r in rows])
    total = sum(r["cached_blocks"] for r in rows)
    st.caption(f"{len(rows)} pod(s) · {total} cached blocks in all · step {frame.step}"
               + ("" if live else " (a stored run: ages are at its last step)"))
    st.dataframe(table, hide_index=True, width="stretch")
    fp = fleet_placement(raw)
    if fp["placed_chains"]:
        st.markdown(f"**Is the router losing hits?** Of the {fp['placed_blocks']} prompt blocks of the "
                    f"{fp['placed_chains']} requests seen starting or branching, the pods they went to "
                    f"held {fp['achieved_blocks']} ({_pct(fp['achieved_hit_rate'])}); the best placement "
                    f"(any pod holding the prefix then) would have held {fp['reachable_blocks']} "
                    f"({_pct(fp['reachable_hit_rate'])}): {fp['lost_blocks']} block(s) recomputed that "
                    "another pod had.")
    flagged = [r for r in rows if r["alerts"]]
    for r in flagged:
        st.warning(f"**{r['pod']}**: " + "; ".join(r["alerts"]), icon=":material/warning:")
    st.caption("Per minute: blocks in the last 60 s of the pod's own clock. Evicted = the last "
               "copy of a hash removed (clears and restarts apart); 'evicted before reuse' is the "
               "share of those no second store or branch ever reused (hits that store nothing are "
               "invisible in the stream, so it is an upper bound). Hit rate and usage come from "
               "the pod's /metrics (attach --metrics). Index completeness = batches applied / "
               f"(applied + lost). A pod quiet for over {QUIET_ALERT_S:.0f} s is flagged. 'hit (events)' "
               "and 'reachable (events)' read each stored chain that starts a prompt or branches "
               "below a cached block as a request: the share of its blocks the pod already held, and "
               "the most any pod held, by hash (a bound: requests that stored nothing and chains "
               "extending a leaf are not seen; the scraped hit rate is the engine's own). The "
               "Attached page has each pod's prefix tree, the prefix locator, the fidelity "
               "details and the wire doctor.")
    df = pod_series(frame.shown_records)
    st.plotly_chart(per_pod_lines(df, "cached_blocks", "Cached blocks per pod", "blocks"),
                    config=PLOT_CONFIG, key=f"fleet_{frame.source}_cached")


attached_page("Fleet: every pod at a glance", "fleet", render_fleet,
              "Every pod `kvscope attach` follows, one row each (`kvscope attach --kv-events "
              "tcp://POD:5557 --pod a ...`; see the Attached page).")

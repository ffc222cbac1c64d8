"""Fleet: every attached pod as a row, the operator's first look at a deployment.

Live when this dashboard is connected to ``kvscope attach``; otherwise a stored attached run
(at its last step). Each row is what the attach worker put in its steps
(``engine.attach.fleet``: cached blocks, stored / removed / evicted blocks per minute, the
share evicted before any reuse, index fidelity) with the pod's scraped hit rate and usage and
the age of its latest batch (``fleet.overview``); then what each routing policy of
``kvscope simulate`` would have done with the requests seen (``engine.attach.policy_replay``,
riding on the steps as ``policies``), over time; then the miss explainer per pod
(``fleet.miss_explainer``) beside the engine's own causes. The page only draws.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.attached_frame import AttachedFrame, fleet_rows, pod_series
from dashboard.attached_page import attached_page
from dashboard.figures.attached import per_pod_lines
from dashboard.panels import PLOT_CONFIG
from engine.attach.fleet import ENGINE_CAUSES, QUIET_ALERT_S, fleet_placement, miss_explainer, overview
from engine.simulate.routers import ROUTERS


def _pct(v) -> str:
    return "–" if v is None or v != v else f"{100 * v:.1f}%"


def _age(v) -> str:
    return "–" if v is None else f"{v:.0f} s" if v >= 10 else f"{v:.1f} s"


def _span(low, high) -> str:
    """A token usage: exact (kvscope pods) or the bound an attached stream allows."""
    return "–" if low is None else _pct(low) if low == high else f"{_pct(low)}–{_pct(high)}"


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
        "hit rate": _pct(r["hit_rate"]), "KV usage (blocks)": _pct(r["kv_usage"]),
        "token usage": _span(r["token_usage_low"], r["token_usage_high"]),
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
               "the pod's /metrics (attach --metrics). KV usage counts blocks; token usage is the filled "
               "token slots' share of the pool (vLLM #57336): exact where the pod exports it "
               "(kvscope), else the range its block usage, pool size and stored full blocks allow "
               "while its stream is complete. Index completeness = batches applied / "
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
    _policies(frame)
    _misses(raw)


ACHIEVED, REACHABLE = "achieved (the pods used)", "reachable (best placement)"


def policy_series(records) -> pd.DataFrame:
    """Long table for ``per_pod_lines``: per step that carried ``policies``, the cumulative hit
    rate of each policy, and the achieved and reachable ones (``pod`` names the line)."""
    rows = []
    for r in records:
        s = r.metrics.get("policies")
        if not s or not s.get("blocks"):
            continue
        rows.append({"step": r.step, "pod": ACHIEVED, "hit_rate": s["achieved_hit_rate"]})
        rows.append({"step": r.step, "pod": REACHABLE, "hit_rate": s["reachable_hit_rate"]})
        for name, p in s["policies"].items():
            rows.append({"step": r.step, "pod": name, "hit_rate": p["hit_rate"]})
    return pd.DataFrame(rows, columns=["step", "pod", "hit_rate"])


def _policies(frame: AttachedFrame) -> None:
    latest = next((r.metrics["policies"] for r in reversed(frame.shown_records) if r.metrics.get("policies")),
                  None)
    st.subheader("What would each routing policy have done?")
    if not latest or not latest.get("requests"):
        st.caption("No request seen yet: a request is a stored chain that starts a prompt or branches "
                   "below a cached block (the routing policies of `kvscope simulate` replay them).")
        return
    pods = latest.get("pods") or []
    table = [{"policy": ACHIEVED, "hit rate": _pct(latest["achieved_hit_rate"]),
              "hit blocks": latest["achieved_blocks"], "requests per pod": "as routed", "models": "the real router"},
             {"policy": REACHABLE, "hit rate": _pct(latest["reachable_hit_rate"]),
              "hit blocks": latest["reachable_blocks"], "requests per pod": "–",
              "models": "any pod that held the prefix then"}]
    for name, p in latest["policies"].items():
        table.append({"policy": name, "hit rate": _pct(p["hit_rate"]), "hit blocks": p["hit_blocks"],
                      "requests per pod": " · ".join(str(p["requests_per_pod"].get(q, 0)) for q in pods),
                      "models": ROUTERS[name].models if name in ROUTERS else "–"})
    st.markdown(f"The **{latest['requests']}** requests seen ({latest['blocks']} full prompt blocks) "
                "routed again by each policy of `kvscope simulate` to a replayed fleet of the same "
                f"{len(pods)} pod(s) ({', '.join(pods)}), beside what the pods used held and the best placement.")
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    caps = latest.get("capacity_blocks") or {}
    st.caption("Assumptions (the events cannot say more): a request is a stored chain that starts a prompt "
               "or branches below a cached block (requests that stored nothing and later chunks of one "
               "prompt are not seen); hits count full blocks; a replayed pod is an LRU of block hashes "
               "sized by the real pod's peak cached blocks once it has evicted ("
               + ", ".join(f"{q}: {'no bound yet' if c is None else c}" for q, c in caps.items())
               + f"); its load counts the requests of the last {latest.get('load_window_s', 0):.0f} s, "
               "as the events never say when a request ends. The oracle reads the replayed caches; "
               "'reachable' reads the real ones. The same figures: GET /routers on the attach server.")
    st.plotly_chart(per_pod_lines(policy_series(frame.shown_records), "hit_rate",
                                  "Hit rate of the requests seen, per routing policy (cumulative)",
                                  "hit rate (%)", percent=True),
                    config=PLOT_CONFIG, key=f"fleet_{frame.source}_policies")


def _misses(raw: dict) -> None:
    st.subheader("Why did prompt tokens miss?")
    rows = miss_explainer(raw)
    if not any(r["missed_tokens"] or r["num_probes"] for r in rows):
        st.caption("No miss yet: the requests seen and the locator's probes are explained here, per pod.")
        return
    table = []
    for r in rows:
        ev, pr, eng = r["events_as_engine"], r["probes_as_engine"], r["engine"]
        table.append({"pod": r["pod"], "missed (events)": r["missed_tokens"],
                      "causes (events)": _causes(r["events"]),
                      **{f"{c} (events)": ev[c] for c in ENGINE_CAUSES},
                      "probes": r["num_probes"], "causes (probes)": _causes(r["probes"]),
                      **{f"{c} (engine)": ("–" if eng is None else int(eng.get(c, 0))) for c in ENGINE_CAUSES}})
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    st.caption("Every missed prompt token has one cause, in tokens. Events: the requests seen, their "
               "stored blocks (what they computed), each with the cause of the first missing block, as "
               "the locator says it (evicted, cleared, restart, diverged, other_keys: LoRA, salt or extra "
               "keys, last_token: the block holding the last prompt token recomputed, never_stored); the "
               "partial last block is never stored, so events cannot show it. Probes: the prompt lookups "
               "(POST /locate), with partial_block and below_block. Both are also summed into the engine's "
               "own three causes (cold = never_stored, other_keys; evicted = evicted, cleared, restart; "
               "partial = diverged, last_token, partial and below the block), beside the engine's own "
               "counts where the pod's /metrics export them (kvscope pods).")


def _causes(c: dict) -> str:
    return " · ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])) or "–"


attached_page("Fleet: every pod at a glance", "fleet", render_fleet,
              "Every pod `kvscope attach` follows, one row each (`kvscope attach --kv-events "
              "tcp://POD:5557 --pod a ...`; see the Attached page).")

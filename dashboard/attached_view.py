"""The Attached view: a vLLM / SGLang / kvscope deployment's prefix cache, from its KV events.

Shared by Live (connected to ``kvscope attach``), Replay (a stored attached run, same
slider) and the Attached page. It says first what a hash-only stream cannot show,
then per pod: headline figures, holes, and the tabs: the prefix tree, cached blocks
over time, store/remove rates, block residency, the scraped hit rate and usage, the
largest shared prefixes, the prompt box (the prefix locator: per pod and tier the longest
cached prefix and where and why its chain breaks, drawn on the tree) and the step's
events. Tabs are lazy like the run view's: only the open one is computed.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.attached_frame import AttachedFrame, fleet_rows, ledger, pod_series, rates, residency
from dashboard.event_log import event_rows
from dashboard.figures.attached import (
    block_label, per_pod_lines, prefix_tree_figure, rates_figure, residency_figure,
)
from dashboard.panels import PLOT_CONFIG
from engine.attach.locator import locate
from engine.events.folds.prefix_tree import PrefixTree

TABS = ("Prefix tree", "Cached blocks", "Residency", "Hit rate & usage", "Shared prefixes",
        "Prompt lookup", "Index fidelity", "Wire doctor", "Event log")
RESIDENCY = (  # (ResidencyLog list, title, what an empty one means)
    ("lifetime_s", "Block lifetime: stored → removed (s)",
     "No block stored since the attach was removed yet."),
    ("idle_before_evict_s", "Idle before eviction: last access → removed (s)",
     "No eviction of a block seen stored yet."),
    ("reuse_gap_s", "Reuse gap: time between certain reuses (s)",
     "No certain reuse yet (a re-store, or a branch below a block)."),
    ("recompute_gap_s", "Recomputed after eviction: removed → stored again (s)",
     "No hash was stored again after its removal."),
)
CANNOT_SHOW = (
    "**A hash-only stream.** The engine publishes which blocks are cached: chained block "
    "hashes, parent links and token ids (`BlockStored` / `BlockRemoved` / `AllBlocksCleared`). "
    "It does not publish physical block ids, ref counts, block tables, requests, partial "
    "blocks, hits or the free queue, so there is **no block grid, no block tables and no "
    "fragmentation view** here, and which request used which block is unknown. Usage, hit "
    "rate, queue and TTFT come from the engine's own `/metrics`, scraped every second.")


def _pct(v: Any) -> str:
    return "–" if v is None or v != v else f"{100 * v:.1f}%"


def _scraped(frame: AttachedFrame, pod: str) -> dict[str, Any]:
    return ((frame.metrics or {}).get("scraped") or {}).get(pod) or {}


def kpis(frame: AttachedFrame) -> None:
    snap = frame.snapshot
    st.caption(f"Step {frame.step} · {len(snap.pods)} pod(s) · {snap.num_cached_blocks} cached "
               f"blocks in all · each step is one received batch (or a hole, a restart, a scrape)")
    fleet = fleet_rows(frame)
    for name in frame.pods():
        p = snap.pods[name]
        m = _scraped(frame, name)
        st.markdown(f"**Pod {name}** · blocks of {p.block_size or '?'} tokens · segment {p.segment}"
                    + (f" · {p.unknown_removals} removals of blocks never seen stored"
                       if p.unknown_removals else ""))
        cols = st.columns(6)
        cols[0].metric("cached blocks", p.num_blocks,
                       help=f"blocks of {p.block_size or '?'} tokens the stream says are cached")
        cols[1].metric("stored · removed", f"{p.stored_blocks} · {p.removed_blocks}",
                       help="blocks stored and removed since the attach")
        cols[2].metric("KV usage", _pct(m.get("kv_cache_usage")),
                       help="scraped: vllm:kv_cache_usage_perc (or sglang:token_usage)")
        cols[3].metric("hit rate", _pct(m.get("prefix_cache_hit_rate")),
                       help="scraped: prefix-cache hits / queries since the attach (tokens)")
        run, wait = m.get("num_requests_running"), m.get("num_requests_waiting")
        cols[4].metric("run · wait", "–" if run is None else f"{run:.0f} · {wait or 0:.0f}",
                       help="scraped: requests running · waiting")
        ttft = m.get("ttft_p50_s")
        cols[5].metric("TTFT p50", "–" if ttft is None else f"{ttft * 1000:.0f} ms",
                       help="scraped: median time to first token since the attach")
        f = fleet.get(name)
        if f is not None:
            d = f.get("dialect") or {}
            st.caption(f"Index fidelity: completeness {_share(f.get('completeness'))} · "
                       f"{f.get('gaps_filled', 0)} gap(s) filled, {f.get('gaps_unfilled', 0)} not · "
                       f"{f.get('restarts', 0)} restart(s) · {f.get('duplicate_batches', 0)} duplicate "
                       f"batch(es) · latest dialect: " + (f"events {d.get('events')}, hashes "
                       f"{d.get('hashes')}, {d.get('frames')} frames, fields {d.get('fields')}"
                       if d and "error" not in d else "–"))
        if m.get("error"):
            st.caption(f"{name}: the last scrape failed ({m['error']}); figures are from the one before.")
        if p.incomplete:
            st.warning(f"Pod **{name}** has a hole in its stream: its cache below may miss blocks "
                       "stored or removed then. " + "; ".join(h.describe() for h in p.holes
                                                              if h.segment == p.segment),
                       icon=":material/warning:")


def _tree_tab(frame: AttachedFrame) -> None:
    snap = frame.snapshot
    if not snap.pods:
        st.info("No pod has sent a batch yet.")
        return
    pod = st.selectbox("Pod", frame.pods(), key=f"{frame.source}_tree_pod")
    view = snap.pods[pod]
    tree = PrefixTree(view)
    st.plotly_chart(prefix_tree_figure(tree, frame.token_text, view.last_ts), config=PLOT_CONFIG,
                    key=f"{frame.source}_tree")
    rooted = sum(1 for r in tree.roots if tree.blocks[r].parent is None)
    st.caption(f"{len(tree.blocks)} cached blocks in {len(tree.roots)} root(s): {rooted} start a "
               f"prompt, {len(tree.roots) - rooted} hang below a block that is no longer cached "
               "(evicted, or stored before the attach). Each box is one block, as wide as the "
               "blocks cached below it, "
               "labelled with its text" + ("" if frame.token_text else
                                          " (token ids: start attach with --tokenizer for text)")
               + "; colour is its age on the engine's clock. Click a box to zoom into its subtree.")


def _residency_tab(frame: AttachedFrame) -> None:
    cache = st.session_state.setdefault("_attached_residency", {})
    recs = frame.shown_records
    hit = cache.get(frame.source)
    if hit is None or hit["key"] != (frame.key, len(recs)):
        hit = cache[frame.source] = {"key": (frame.key, len(recs)), "log": residency(recs)}
    log = hit["log"]
    pods = frame.pods()
    cols = st.columns(2) + st.columns(2)
    for col, (name, title, empty) in zip(cols, RESIDENCY):
        col.plotly_chart(residency_figure({p: log.values(name, p) for p in pods}, title, empty),
                         config=PLOT_CONFIG, key=f"{frame.source}_{name}")
    st.caption("Computed from the events, on the engine's clock. An access is a store of the "
               "block or of a chain below it; a certain reuse is a store of it again while cached "
               "(vLLM's kv_cache_report_mode \"full\") or a second chain branching below it. Hits "
               "that store nothing new are invisible in the stream, so idle times are upper bounds "
               "and reuse a lower bound.")


def _shared_tab(frame: AttachedFrame) -> None:
    rows = []
    for name in frame.pods():
        for sp in PrefixTree(frame.snapshot.pods[name]).shared_prefixes(limit=10):
            text = (frame.token_text(list(sp.token_ids)) if frame.token_text
                    else " ".join(map(str, sp.token_ids[:24])))
            rows.append({"pod": name, "prefix": text[:160] + ("…" if len(text) > 160 else ""),
                         "tokens": sp.num_tokens, "continuations": sp.continuations,
                         "blocks below": sp.blocks_below, "tokens shared": sp.tokens_shared,
                         "from the prompt start": sp.rooted, "branch block": sp.hash[:16]})
    if not rows:
        st.info("No shared prefix yet: a prefix is shared once two different continuations are "
                "cached after it.")
        return
    df = pd.DataFrame(rows).sort_values("tokens shared", ascending=False)
    st.dataframe(df, hide_index=True, width="stretch")
    st.caption("A branch point is a cached block with two or more cached children; "
               "'tokens shared' = (continuations − 1) × prefix tokens: what those continuations "
               "did not each compute.")


def _prompt_ids(frame: AttachedFrame) -> list[int] | None:
    with st.form(f"{frame.source}_prompt_form", border=False):
        text = st.text_area("Prompt", key=f"{frame.source}_prompt", height=100,
                            placeholder="Paste a prompt (or a JSON list of token ids)")
        special = st.checkbox("add special tokens (BOS), as the completions API does", value=True,
                              key=f"{frame.source}_special")
        if not st.form_submit_button("Look up"):
            return None
    text = text.strip()
    if not text:
        return None
    if text.startswith("["):
        try:
            ids = json.loads(text)
        except ValueError as exc:
            st.error(f"Not a JSON list of token ids: {exc}")
            return None
        if not (isinstance(ids, list) and all(isinstance(t, int) and t >= 0 for t in ids)):
            st.error("A token id list holds non-negative integers only.")
            return None
        return ids
    if not frame.tokenizer_file:
        st.error("No tokenizer: start `kvscope attach` with `--tokenizer PATH` (a tokenizer.json "
                 "or a model directory), or paste token ids as a JSON list.")
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(frame.tokenizer_file).encode(text, add_special_tokens=special).ids


def _ledger(frame: AttachedFrame):
    """The run's ledger up to the shown step, folded once per (run, length) and kept."""
    cache = st.session_state.setdefault("_attached_ledger", {})
    recs = frame.shown_records
    hit = cache.get(frame.source)
    if hit is None or hit["key"] != (frame.key, len(recs)):
        hit = cache[frame.source] = {"key": (frame.key, len(recs)), "ledger": ledger(recs)}
    return hit["ledger"]


WHY = {"evicted": "evicted", "cleared": "cleared (reset)", "restart": "lost in a restart",
       "diverged": "diverged", "other_keys": "same tokens, other hash", "never_stored": "never stored",
       "partial_block": "partial last block", "below_block": "shorter than a block",
       "whole_prompt": "whole prompt cached", "no_blocks": "nothing announced yet"}


def _lookup_tab(frame: AttachedFrame) -> None:
    st.caption("The prefix locator: for each pod and tier, the prompt's longest run of leading "
               "full blocks cached there, and the first block that is not, with why (evicted at "
               "a time, a cached continuation that diverges at a token, never stored). Where "
               "kvscope can reproduce the engine's block hashes (vLLM's sha256, kvscope's own) it "
               "chain-hashes the prompt and matches by hash; elsewhere it walks the tree by the "
               "token ids BlockStored carries. `kvscope attach` answers the same as JSON: "
               "`POST /locate`.")
    ids = _prompt_ids(frame)
    if ids is None:
        return
    answers = None
    if frame.source == "live":  # the running attach answers from its whole history
        from dashboard.attach_http import post_json
        from dashboard.connection import settings

        got = post_json(settings().url, "/locate", {"token_ids": ids})
        if "error" in got:
            st.caption(f"The attach server did not answer /locate ({got['error']}); the answer "
                       "below is from the steps this dashboard holds.")
        else:
            answers = got["pods"]
            st.caption(f"`kvscope attach` answered at its step {got['step']} (POST /locate).")
    if answers is None:
        answers = [loc.to_dict() for loc in locate(frame.snapshot, ids, _ledger(frame), frame.pods())]
    rows = []
    for d in answers:
        brk = d["break"]
        rows.append({"pod": d["pod"], "tier": d["tier"] or "–", "matched by": d["method"] or "–",
                     "cached blocks": d["cached_blocks"], "cached tokens": d["cached_tokens"],
                     "hit if sent now": d["hit_tokens"], "prompt tokens": len(ids),
                     "chain breaks at block": brk["block"], "at token": brk["token"],
                     "why": WHY.get(brk["reason"], brk["reason"]),
                     "missed tokens by cause": ", ".join(f"{WHY.get(k, k.replace('_', ' '))} {v}"
                                                         for k, v in (d.get("misses") or {}).items()) or "–",
                     "block size": d["block_size"]})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption("'hit if sent now' leaves out the last prompt token: the engine recomputes it for "
               "its logits, so a prompt of whole cached blocks hits one block less. Every token that "
               "would miss has one cause (they add up to the prompt's tokens less the hit): the last "
               "token's block, the break's reason for every full block from the break on, a partial "
               "last block.")
    best = max(answers, key=lambda d: d["cached_blocks"], default=None)
    if best is not None and best["cached_blocks"] and frame.token_text:
        cached = ids[:best["cached_tokens"]]
        st.markdown(f"Cached on **{best['pod']}**: `{block_label(tuple(cached), frame.token_text, 400)}`")
    for d in answers:
        for t in d["tiers"]:
            st.markdown(f"**{d['pod']}** · {t['tier'] or 'cache'}: {t['cached_blocks']} block(s) "
                        f"({t['cached_tokens']} tokens) cached; {t['break']['detail']}.")
    shown = [d for d in answers if d["tiers"] and d["pod"] in frame.snapshot.pods]
    if not shown:
        return
    pick = st.selectbox("Draw the located prefix on the tree of pod", [d["pod"] for d in shown],
                        key=f"{frame.source}_locate_pod")
    first = next(d for d in shown if d["pod"] == pick)["tiers"][0]
    view = frame.snapshot.pods[pick]
    st.plotly_chart(prefix_tree_figure(PrefixTree(view, first["tier"]), frame.token_text, view.last_ts,
                                       path=first["hashes"]),
                    config=PLOT_CONFIG, key=f"{frame.source}_locate_tree")
    st.caption(f"The prompt's cached prefix on {pick}'s {first['tier'] or 'cache'} is outlined "
               f"({first['cached_blocks']} block(s)); the chain breaks after it: "
               f"{WHY.get(first['break']['reason'], first['break']['reason'])}.")


def _share(v: Any) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def fidelity_table(rows: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The fidelity monitor's table: one row per pod, as the attach worker counted."""
    out = []
    for pod, r in rows.items():
        out.append({"pod": pod, "completeness": _share(r.get("completeness")),
                    "batches": r.get("received", 0), "live": r.get("live", 0),
                    "replayed: history · gap · tail": f"{r.get('replayed_history', 0)} · "
                    f"{r.get('replayed_gap', 0)} · {r.get('replayed_tail', 0)}",
                    "gaps filled": r.get("gaps_filled", 0), "gaps unfilled": r.get("gaps_unfilled", 0),
                    "holes": r.get("holes", 0), "batches lost": r.get("lost_batches", 0),
                    "restarts": r.get("restarts", 0), "duplicate batches": r.get("duplicate_batches", 0),
                    "duplicate stores": r.get("duplicate_stores", 0),
                    "placeholder stores": r.get("placeholder_stores", 0),
                    "removals never stored": r.get("unknown_removals", 0),
                    "undecodable": r.get("undecodable", 0), "bad messages": r.get("bad_messages", 0),
                    "replay failures": r.get("replay_failures", 0),
                    "dialects": "; ".join(f"{k} ×{n}" for k, n in (r.get("dialects") or {}).items())})
    return pd.DataFrame(out)


def _fidelity_tab(frame: AttachedFrame) -> None:
    rows = fleet_rows(frame)
    if not rows:
        st.info("No fidelity figures yet: they ride on the attach worker's steps (runs recorded "
                "before the fleet microscope have none).")
        return
    st.dataframe(fidelity_table(rows), hide_index=True, width="stretch")
    st.caption("Is the index complete? Completeness = batches applied / (applied + lost), over the "
               "publisher's sequence numbers up to the latest seen. A gap is filled through the "
               "replay socket when it still has the batches; what it has not is a hole (batches "
               "lost). A restart (seq back to 0) empties the pod's cache. Duplicate batches are a "
               "replay overlapping the live stream (dropped); duplicate stores are a hash stored "
               "while cached (vLLM's recomputed copy); placeholder stores carry a hash only (an "
               "offload tier). Removals of hashes never stored mean a store was missed (a hole, "
               "or a publisher that dropped it). Dialect: event encoding (tagged map or array), "
               "hash kind (int or bytes), frame layout, and the field set (vLLM 0.3x, SGLang, "
               "common).")


def _wire_tab(frame: AttachedFrame) -> None:
    pods = [p.get("pod") for p in frame.config.get("pods") or []] or frame.pods()
    if not pods:
        st.info("No pod yet.")
        return
    pod = st.selectbox("Pod", pods, key=f"{frame.source}_wire_pod")
    if frame.source == "live":
        from dashboard.attach_http import get_json
        from dashboard.connection import settings

        got = get_json(settings().url, "/wire", pod=pod)
        if "error" in got:
            st.error(f"The attach server did not answer /wire: {got['error']}")
            return
        batches = got.get("batches") or []
        st.caption(f"The last {len(batches)} raw batch(es) {pod} sent, newest first, as received "
                   "and decoded field by field from the msgpack (array events' fields named by "
                   "vLLM's order; fields past it marked unknown). `GET /wire?pod=` gives the same.")
        for b in batches:
            d = b.get("dialect") or {}
            head = (f"seq {b['seq']} · segment {b['segment']} · {b['fill']} · {b['bytes']} bytes · "
                    + (f"undecodable ({d['error']})" if "error" in d else
                       f"events {d.get('events')} · hashes {d.get('hashes')} · {b['frames']} frames · "
                       f"fields {d.get('fields')}"))
            with st.expander(head, expanded=b is batches[0]):
                st.dataframe(pd.DataFrame(b.get("fields") or []), hide_index=True, width="stretch")
        if not batches:
            st.info(f"{pod} has sent no batch yet.")
        return
    st.caption("Raw bytes are kept only by a running `kvscope attach` (the wire doctor live); a "
               "stored run has each batch's dialect and its events as decoded:")
    rows = []
    for r in reversed(frame.shown_records):
        m = r.metrics
        if m.get("pod") != pod or "source_seq" not in m:
            continue
        w = m.get("wire") or {}
        rows.append({"step": r.step, "seq": m.get("source_seq"), "how": m.get("fill", "?"),
                     "events": w.get("events"), "hashes": w.get("hashes"), "frames": w.get("frames"),
                     "fields": w.get("fields"), "kinds": ", ".join(e.type for e in r.events)})
        if len(rows) >= 50:
            break
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.info(f"No batch of {pod} up to this step.")


def render_attached_view(frame: AttachedFrame, marker: int | None = None) -> None:
    """Headline figures, the hash-only caveat, and the lazy tabs."""
    st.info(CANNOT_SHOW, icon=":material/info:")
    kpis(frame)
    tabs = st.tabs(TABS, key=f"{frame.source}_attached_tabs", on_change="rerun")
    panels = dict(zip(TABS, tabs))

    def is_open(name: str) -> bool:
        return panels[name].open is not False

    series = None

    def get_series():
        nonlocal series
        if series is None:
            series = pod_series(frame.shown_records if frame.source == "live" else frame.records)
        return series

    with panels["Prefix tree"]:
        if is_open("Prefix tree"):
            _tree_tab(frame)
    with panels["Cached blocks"]:
        if is_open("Cached blocks"):
            df = get_series()
            st.plotly_chart(per_pod_lines(df, "cached_blocks", "Cached blocks per pod", "blocks",
                                          marker=marker), config=PLOT_CONFIG,
                            key=f"{frame.source}_cached")
            shown = df[df["step"] <= frame.step] if marker is not None else df
            st.plotly_chart(rates_figure(rates(shown)), config=PLOT_CONFIG,
                            key=f"{frame.source}_rates")
    with panels["Residency"]:
        if is_open("Residency"):
            _residency_tab(frame)
    with panels["Hit rate & usage"]:
        if is_open("Hit rate & usage"):
            df = get_series()
            none = "No scraped figures: start attach with --metrics http://HOST:PORT/metrics."
            left, right = st.columns(2)
            left.plotly_chart(per_pod_lines(df, "prefix_cache_hit_rate", "Prefix-cache hit rate "
                                            "since the attach (scraped, %)", "hit rate (%)",
                                            percent=True, marker=marker, empty=none),
                              config=PLOT_CONFIG, key=f"{frame.source}_hitrate")
            right.plotly_chart(per_pod_lines(df, "kv_cache_usage", "KV cache usage (scraped, %)",
                                             "usage (%)", percent=True, marker=marker, empty=none),
                               config=PLOT_CONFIG, key=f"{frame.source}_usage")
            left, right = st.columns(2)
            left.plotly_chart(per_pod_lines(df, "num_requests_waiting", "Requests waiting (scraped)",
                                            "requests", marker=marker, empty=none),
                              config=PLOT_CONFIG, key=f"{frame.source}_waiting")
            right.plotly_chart(per_pod_lines(df, "ttft_p50_s", "TTFT median since the attach "
                                             "(scraped, s)", "seconds", marker=marker, empty=none),
                               config=PLOT_CONFIG, key=f"{frame.source}_ttft")
    for name, draw in (("Shared prefixes", _shared_tab), ("Prompt lookup", _lookup_tab),
                       ("Index fidelity", _fidelity_tab), ("Wire doctor", _wire_tab)):
        with panels[name]:
            if is_open(name):
                draw(frame)
    with panels["Event log"]:
        if is_open("Event log"):
            rows = event_rows(frame.events)
            st.caption(f"Events of step {frame.step}, as the batch carried them.")
            if rows:
                st.dataframe(pd.DataFrame(rows).drop(columns=["request"]), hide_index=True,
                             width="stretch", height=min(420, 40 + 35 * len(rows)))
            else:
                st.info("This step carried no events (a scrape of the engine's metrics).")

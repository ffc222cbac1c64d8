"""Streams the outputs of this browser session's requests as they are generated, a page
of ``PAGE_SIZE`` at a time (newest first), with each preset's check of its claim."""

from __future__ import annotations

import math

import streamlit as st

from dashboard.connection import connection, feed
from dashboard.preset_effects import effects, verdict

PAGE_SIZE = 12
PAGE_KEY = "outputs_page"


def session_request_ids(key: str) -> list[str]:
    """This session's requests, newest preset first, then the form's."""
    ids: list[str] = []
    for runner in st.session_state.get("submit_runners", []):
        ids += runner.request_ids
    return ids + [r for r in st.session_state.get(key, []) if r not in ids]


def status_line(p) -> str:
    if p.error is not None:
        return f":material/error: {p.error.code}: {p.error.message}"
    if p.finished is not None:
        m = p.finished.metrics
        reasons = ", ".join(str(o.get("finish_reason")) for o in p.finished.outputs)
        ttft = m.get("ttft")
        return (f":material/check_circle: finished ({reasons}) · "
                f"{m.get('num_prompt_tokens', '?')} prompt tokens, "
                f"{m.get('num_cached_tokens', 0)} from the prefix cache · "
                f"{m.get('num_output_tokens', '?')} generated"
                + (f" · TTFT {ttft * 1000:.0f} ms" if isinstance(ttft, (int, float)) else ""))
    n = sum(len(t) for t in p.token_ids.values())
    if n:
        return f":material/autorenew: generating: {n} token{'' if n == 1 else 's'} so far"
    return ":material/hourglass_top: waiting for its first token…"


def _preset_checks() -> None:
    """Each preset run from this tab: its progress, then what the run shows."""
    records = None
    for runner in st.session_state.get("submit_runners", [])[:3]:
        w = runner.workload
        if runner.error:
            st.error(f"{w.name}: {runner.error}")
            continue
        if not runner.request_ids:
            st.caption(f"{w.name}: submitting wave {runner.wave} of {len(w.waves)}…")
            continue
        if records is None:
            records = list(feed().records)
        fx = effects(records, runner.request_ids)
        shown, words = verdict(w.effect, fx)
        secs = fx.seconds
        took = "" if secs is None else f" in {secs:.1f} s"
        if fx.done and runner.done:
            icon = ":material/check_circle:" if shown else ":material/warning:"
            st.markdown(f"{icon} **{w.name}** done{took}: {words}.")
        else:
            st.caption(f"{w.name}: running{took} (wave {runner.wave} of {len(w.waves)}): "
                       f"{words} so far.")


def render_outputs(key: str) -> None:
    """Each request: status line, then each sample's text so far."""
    _preset_checks()
    ids = session_request_ids(key)
    if not ids:
        st.caption("Nothing submitted from this tab yet.")
        return
    pages = max(1, math.ceil(len(ids) / PAGE_SIZE))
    page = min(max(int(st.session_state.get(PAGE_KEY, 1)), 1), pages)
    if pages > 1:
        st.number_input(f"page (of {pages}, {PAGE_SIZE} requests each, newest first)",
                        min_value=1, max_value=pages, value=page, step=1, key=PAGE_KEY)
    conn = connection()
    for rid in ids[(page - 1) * PAGE_SIZE:page * PAGE_SIZE]:
        p = conn.outputs(rid)
        if p is None:
            continue
        with st.container(border=True):
            st.markdown(f"**{rid}** · {status_line(p)}")
            indices = sorted(p.texts) or [0]
            for i in indices:
                text = p.texts.get(i, "")
                label = f"sample {i}: " if len(indices) > 1 else ""
                st.text(f"{label}{text}" if text else f"{label}…")

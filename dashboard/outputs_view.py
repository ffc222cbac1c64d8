"""Streams the outputs of this browser session's requests as they are generated."""

from __future__ import annotations

import streamlit as st

from dashboard.connection import connection

MAX_SHOWN = 12  # newest requests; older ones are in Replay


def _status(p) -> str:
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
    return (f":material/pending: generating… {n} token(s) so far" if n
            else ":material/hourglass_top: waiting for its first token…")


def render_outputs(key: str) -> None:
    """Each request: status line, then each sample's text so far."""
    ids: list[str] = []
    for runner in st.session_state.get("submit_runners", []):  # newest preset first
        ids += runner.request_ids
        if runner.error:
            st.error(f"{runner.workload.name}: {runner.error}")
    ids += [r for r in st.session_state.get(key, []) if r not in ids]
    if not ids:
        st.caption("Nothing submitted from this tab yet.")
        return
    conn = connection()
    for rid in ids[:MAX_SHOWN]:
        p = conn.outputs(rid)
        if p is None:
            continue
        with st.container(border=True):
            st.markdown(f"**{rid}** · {_status(p)}")
            indices = sorted(p.texts) or [0]
            for i in indices:
                text = p.texts.get(i, "")
                label = f"sample {i}: " if len(indices) > 1 else ""
                st.text(f"{label}{text}" if text else f"{label}…")
    if len(ids) > MAX_SHOWN:
        st.caption(f"{len(ids) - MAX_SHOWN} older request(s) not shown; see Replay.")

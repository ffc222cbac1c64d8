"""Engine-wide actions more than one page offers: reset the prefix cache, abort
everything. Each tells its result in words (a toast), never as a raw reply."""

from __future__ import annotations

import streamlit as st

from engine.client import ServerError

from dashboard.connection import connection


def reset_message(num_blocks_reset: int) -> str:
    """The reset's answer in words (the server's ``ok`` result holds the count)."""
    if not num_blocks_reset:
        return "Prefix cache reset: no block held a cached hash, nothing changed."
    blocks = "block" if num_blocks_reset == 1 else "blocks"
    return (f"Prefix cache reset: {num_blocks_reset} free cached {blocks} forgot their "
            "hashes (counted as reset, not as LRU evictions). The next identical prompt "
            "misses cold.")


def reset_prefix_cache() -> None:
    try:
        res = connection().reset_prefix_cache(timeout=10)
        st.toast(reset_message(int(res.result.get("num_blocks_reset", 0))))
    except (ServerError, TimeoutError) as exc:
        st.toast(f"Reset failed: {exc}")


def abort_everything() -> None:
    """The engine-wide abort (any client's requests), told in a toast."""
    try:
        n = int(connection().abort_all(timeout=10).result.get("num_aborted", 0))
    except (ServerError, TimeoutError) as exc:
        st.toast(f"Abort failed: {exc}")
        return
    st.toast(f"Aborted {n} request{'' if n == 1 else 's'} on the engine." if n
             else "Nothing was running on the engine.")

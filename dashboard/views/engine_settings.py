"""Engine: restart the engine with another pool or scheduler shape (a new run)."""

from __future__ import annotations

import streamlit as st

from engine.client import ServerError
from engine.events.versions import LONG_PREFILL_CAP

from dashboard.connection import attached, connection, restart_managed_server, server_status

WHY_FIXED = """
**Why these are fixed while an engine runs.** The KV cache is allocated once, up front:
one tensor per layer shaped `[num_blocks, block_size, kv_heads, head_dim]` for keys and
one for values. Block tables, the slot indices the kernels write into and the free queue
all speak in those block ids, so a different `block_size` or `num_blocks` means a
different tensor and ids that no longer point at anything valid. Prefix-cache hashes
cover exactly `block_size` tokens each, so a block-size change voids every cached hash
too. The token budget (`max_num_batched_tokens`) and `max_num_seqs` shape every batch the
scheduler builds (on real servers, also the CUDA graphs captured for them).

So a change here rebuilds the engine: requests in flight are aborted and a **new run**
starts, recorded separately. Run a preset before and after, then put both runs side by
side on the **Compare** page.
"""

BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
SHOWN = ("model_name", "device", "dtype", "block_size", "num_blocks", "max_model_len",
         "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
         "enable_chunked_prefill", "long_prefill_token_threshold", "n_sharing",
         "kv_bytes_per_block")


def _form(cfg: dict) -> dict | None:
    """The restart options, or None until the form is submitted."""
    with st.form("engine_form"):
        c = st.columns(4)
        bs = int(cfg.get("block_size") or 16)
        block_size = c[0].selectbox("block_size", BLOCK_SIZES, help="token slots per block",
                                    index=BLOCK_SIZES.index(bs) if bs in BLOCK_SIZES else 4)
        num_blocks = c[1].number_input("num_kv_blocks", 1, 1_000_000,
                                       int(cfg.get("num_blocks") or 256),
                                       help="pool size in blocks")
        budget = c[2].number_input("max_num_batched_tokens", 1, 1_000_000,
                                   int(cfg.get("max_num_batched_tokens") or 512),
                                   help="token budget per step (the prefill chunk size)")
        seqs = c[3].number_input("max_num_seqs", 1, 4096, int(cfg.get("max_num_seqs") or 64),
                                 help="most requests running at once")
        c = st.columns(5)
        mml = c[0].number_input("max_model_len", 2, 1_000_000,
                                int(cfg.get("max_model_len") or 2048),
                                help="longest prompt + output, in tokens (lowered to fit the "
                                     "pool if it does not)")
        thr = c[1].number_input("long_prefill_token_threshold", 0, 1_000_000,
                                int(cfg.get("long_prefill_token_threshold") or 0),
                                help="most tokens one request may take per step (0 = no cap): "
                                     f"{LONG_PREFILL_CAP.what} {LONG_PREFILL_CAP.tag()}")
        prefix = c[2].checkbox("prefix caching", bool(cfg.get("enable_prefix_caching", True)))
        chunked = c[3].checkbox("chunked prefill",
                                bool(cfg.get("enable_chunked_prefill", True)))
        go = c[4].form_submit_button("Restart engine", type="primary", width="stretch")
    if not go:
        return None
    if int(block_size) != bs and int(num_blocks) == int(cfg.get("num_blocks") or 256):
        # only the block size changed: the same pool memory in other blocks (a restart may
        # never grow the pool past what the server started with)
        num_blocks = max(1, int(num_blocks) * bs // int(block_size))
    return {"block_size": int(block_size), "num_kv_blocks": int(num_blocks),
            "max_model_len": int(mml), "max_num_batched_tokens": int(budget),
            "max_num_seqs": int(seqs), "enable_prefix_caching": bool(prefix),
            "enable_chunked_prefill": bool(chunked), "long_prefill_token_threshold": int(thr)}


def fit_model_len(options: dict) -> tuple[dict, str | None]:
    """Options whose max_model_len fits the pool (one sequence must fit, else the engine
    refuses to start), and a note when it had to be lowered."""
    slots = options["num_kv_blocks"] * options["block_size"]
    if options["max_model_len"] <= slots:
        return options, None
    note = (f"max_model_len lowered from {options['max_model_len']} to {slots}: one "
            f"sequence must fit the {options['num_kv_blocks']} blocks × "
            f"{options['block_size']} slots.")
    return {**options, "max_model_len": slots}, note


def _restart(options: dict) -> None:
    with st.spinner("Rebuilding the engine…"):
        try:
            res = connection().restart(options, timeout=120)
        except (ServerError, TimeoutError) as exc:
            st.error(f"Restart refused; the old engine keeps serving. {exc}")
            return
    result = res.result
    st.success(f"New run `{result.get('run_id')}` started (previous run: "
               f"`{result.get('previous_run_id')}`). Open Live to watch it.")


def page() -> None:
    st.title("Engine settings")
    if attached():
        st.info("`kvscope attach` watches a deployment it does not own: its engine settings are "
                "set where it is served (vLLM's or SGLang's own flags).", icon=":material/visibility:")
        st.dataframe((connection().view().config or {}).get("pods") or [], hide_index=True)
        return
    view = connection().view()
    if view.status != "live" or not view.config:
        srv = server_status()
        st.info(f"The engine is not ready ({srv.status}: {srv.detail or view.status}).")
        if srv.managed is not None and st.button("Restart the server process"):
            restart_managed_server()
            st.rerun()
        st.markdown(WHY_FIXED)
        return
    st.subheader(f"Restart with new settings (current run `{view.run_id}`)")
    options = _form(view.config)
    if options is not None:
        options, note = fit_model_len(options)
        if note:
            st.info(note)
        _restart(options)
    left, right = st.columns([1, 1.6])
    with left:
        st.markdown("**Current engine**")
        st.dataframe([{"setting": k, "value": str(view.config.get(k, "–"))} for k in SHOWN],
                     hide_index=True, width="stretch", height=35 * (len(SHOWN) + 1) + 3)
    right.markdown(WHY_FIXED)


page()

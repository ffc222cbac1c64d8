"""Submit: send a prompt or a chat with sampling parameters, or one teaching preset."""

from __future__ import annotations

import os

import streamlit as st

from engine.client import ServerError
from engine.openai.snippets import TOKEN_ENV, curl_snippet, python_snippet

from dashboard.connection import attached, connection, feed, settings
from dashboard.outputs_view import render_outputs
from dashboard.preset_runner import PresetRunner, submit_one
from dashboard.presets import PRESETS, Submission
from dashboard.server_process import probe_health

MY_REQUESTS = "submit_request_ids"


def _remember(ids: list[str]) -> None:
    st.session_state[MY_REQUESTS] = ids + st.session_state.get(MY_REQUESTS, [])


def _params() -> dict:
    c = st.columns(3) + st.columns(3)
    temperature = c[0].slider("temperature", 0.0, 2.0, 0.0, 0.05, key="sp_temperature",
                              help="0 = greedy (deterministic)")
    top_p = c[1].slider("top_p", 0.05, 1.0, 1.0, 0.05, key="sp_top_p")
    top_k = c[2].number_input("top_k (0 = off)", 0, 1000, 0, key="sp_top_k")
    max_tokens = c[3].number_input("max_tokens", 1, 4096, 48, key="sp_max_tokens")
    n = c[4].number_input("n (samples)", 1, 8, 1, key="sp_n",
                          help="n > 1 forks the request: samples share blocks copy-on-write")
    stop = c[5].text_input("stop (separate with |)", key="sp_stop",
                           help="strings that end generation, e.g. `.|!`")
    params = {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k),
              "max_tokens": int(max_tokens), "n": int(n)}
    stops = [s for s in stop.split("|") if s]
    if stops:
        params["stop"] = stops
    return params


def _compose() -> None:
    st.subheader("Your own request")
    mode = st.radio("Input", ["Prompt", "Chat"], horizontal=True, key="submit_mode")
    with st.form("submit_form", border=True):
        if mode == "Prompt":
            prompt = st.text_area("Prompt", "The three ways to allocate memory for a KV cache "
                                  "are", key="submit_prompt", height=90)
            messages = None
        else:
            system = st.text_input("System message", "You are a concise assistant.",
                                   key="submit_system")
            user = st.text_area("User message", "Why do paged KV caches waste less memory?",
                                key="submit_user", height=90)
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": user}]
            prompt = None
        params = _params()
        sent = st.form_submit_button("Submit", type="primary")
    if sent:
        if mode == "Prompt" and not (prompt or "").strip():
            st.error("Write a prompt first.")
            return
        try:
            rid = submit_one(connection(), feed(), Submission(params, prompt, messages))
        except (ServerError, TimeoutError) as exc:
            st.error(f"The server refused the request: {exc}")
            return
        _remember([rid])
        st.toast(f"accepted as {rid}")


def _presets() -> None:
    view = connection().view()
    if view.status != "live":
        st.info(f"Waiting for the engine ({view.status})… presets unlock when it is live.")
    cols = st.columns(len(PRESETS))
    for col, (key, build) in zip(cols, PRESETS.items()):
        workload = build(view.config or {})
        with col.container(border=True):
            st.markdown(f"**{workload.name}**")
            st.caption(f"{workload.size} request{'s' if workload.size > 1 else ''}. "
                       f"{workload.watch}")
            if st.button("Run preset", key=f"preset_{key}", width="stretch",
                         disabled=view.status != "live"):
                runner = PresetRunner(connection(), feed(), workload).start()
                st.session_state.setdefault("submit_runners", []).insert(0, runner)
                st.toast(f"{workload.name}: submitting {workload.size} request(s)")


def _api_snippets() -> None:
    """Copy-paste clients for this server's OpenAI API: their requests show up here too."""
    # The name the API answers to (--served-model-name, else --model), as /healthz says it.
    health = probe_health(settings().health_url) or {}
    model = health.get("served_model_name") or settings().model
    token = bool(os.environ.get(TOKEN_ENV))
    with st.expander("From your own code: the OpenAI API on the same port", expanded=False):
        st.caption("Any OpenAI client, app or benchmark can drive this engine; its requests "
                   "appear on the Live page and in the recording (source `openai`), and each "
                   "answer names its request in the `x-kvscope-request-id` header.")
        st.code(python_snippet(settings().api_url, model, token), language="python")
        st.code(curl_snippet(settings().api_url, model, token), language="bash")


def page() -> None:
    st.title("Submit requests")
    if attached():
        st.info("This dashboard watches a deployment through `kvscope attach`, which only "
                "listens: send requests to the deployment's own API (e.g. its OpenAI endpoint), "
                "then watch them on the Live page.", icon=":material/visibility:")
        return
    st.subheader("Teaching presets")
    st.caption("One click creates a workload sized to the running engine. "
               "Open the Live page to watch it.")
    conn = connection()
    live = conn.wait_live(timeout=2.0)  # a just-opened connection needs a moment
    # until live, re-check every second so the preset buttons unlock by themselves
    st.fragment(run_every=None if live else 1.0)(_presets)()
    _api_snippets()
    left, right = st.columns([1, 1.15], gap="medium")
    with left:
        _compose()
    with right:
        st.subheader("Outputs (streaming)")
        with st.container(height=560, border=False):
            st.fragment(run_every=0.5)(render_outputs)(MY_REQUESTS)


page()

"""Submit: send a prompt or a chat with sampling parameters, or one teaching preset."""

from __future__ import annotations


import streamlit as st

from engine import envs
from engine.client import ServerError
from engine.openai.snippets import curl_snippet, python_snippet

from dashboard.connection import attached, connection, feed, settings
from dashboard.engine_actions import abort_everything
from dashboard.outputs_view import render_outputs, session_request_ids
from dashboard.preset_runner import PresetRunner, submit_one
from dashboard.presets import PRESETS, Submission, Tokens
from dashboard.server_process import probe_health
from dashboard.submit_form import validate
from dashboard.token_text import token_counter_for

MY_REQUESTS = "submit_request_ids"
SENT = "submit_go"  # the form's button key: True in the run its click started


def _remember(ids: list[str]) -> None:
    st.session_state[MY_REQUESTS] = ids + st.session_state.get(MY_REQUESTS, [])


def _note(errors: dict[str, str], field: str, where=st) -> None:
    """A field's problem, right under it."""
    if field in errors:
        where.error(errors[field], icon=":material/error:")


def _values() -> dict:
    ss = st.session_state
    params = {"temperature": float(ss.get("sp_temperature", 0.0)),
              "top_p": float(ss.get("sp_top_p", 1.0)), "top_k": ss.get("sp_top_k", 0),
              "max_tokens": ss.get("sp_max_tokens", 48), "n": ss.get("sp_n", 1)}
    stops = [s for s in str(ss.get("sp_stop", "")).split("|") if s]
    if stops:
        params["stop"] = stops
    return params


def _params(errors: dict[str, str]) -> None:
    c = st.columns(3) + st.columns(3)
    c[0].slider("temperature", 0.0, 2.0, 0.0, 0.05, key="sp_temperature",
                help="0 = greedy (deterministic)")
    c[1].slider("top_p", 0.05, 1.0, 1.0, 0.05, key="sp_top_p")
    # no min/max on the inputs: an out-of-range number is shown with its range, not
    # silently clamped or dropped
    c[2].number_input("top_k (0 = off)", value=0, step=1, key="sp_top_k")
    _note(errors, "top_k", c[2])
    c[3].number_input("max_tokens", value=48, step=1, key="sp_max_tokens")
    _note(errors, "max_tokens", c[3])
    c[4].number_input("n (samples)", value=1, step=1, key="sp_n",
                      help="n > 1 samples one prompt several times (shared blocks)")
    _note(errors, "n", c[4])
    c[5].text_input("stop (separate with |)", key="sp_stop",
                    help="strings that end generation, e.g. `.|!`")


def _compose() -> None:
    st.subheader("Your own request")
    mode = st.radio("Input", ["Prompt", "Chat"], horizontal=True, key="submit_mode")
    view = connection().view()
    ss = st.session_state
    errors: dict[str, str] = {}
    if ss.get(SENT):  # checked before the form is drawn, so each note sits by its field
        errors = validate(mode, ss.get("submit_prompt", ""), ss.get("submit_system", ""),
                          ss.get("submit_user", ""), _values(), view.config,
                          view.hello.limits if view.hello else None,
                          token_counter_for(view.config))
    with st.form("submit_form", border=True):
        if mode == "Prompt":
            st.text_area("Prompt", "The three ways to allocate memory for a KV cache are",
                         key="submit_prompt", height=90)
            _note(errors, "prompt")
        else:
            st.text_input("System message", "You are a concise assistant.", key="submit_system")
            st.text_area("User message", "Why do paged KV caches waste less memory?",
                         key="submit_user", height=90)
            _note(errors, "user")
        _note(errors, "size")
        _params(errors)
        sent = st.form_submit_button("Submit", type="primary", key=SENT)
    if not sent or errors:
        return
    if mode == "Prompt":
        prompt, messages = ss.get("submit_prompt", ""), None
    else:
        system = ss.get("submit_system", "")
        prompt = None
        messages = ([{"role": "system", "content": system}] if system.strip() else []) + \
            [{"role": "user", "content": ss.get("submit_user", "")}]
    try:
        rid = submit_one(connection(), feed(), Submission(_values(), prompt, messages))
    except (ServerError, TimeoutError) as exc:
        st.error(f"The server refused the request: {exc}")
        return
    _remember([rid])
    st.toast(f"accepted as {rid}")


def _run(key: str, restart: dict | None) -> None:
    """A preset's button: restart to the engine it needs first (one click), then run it
    sized for the engine that answers."""
    conn = connection()
    if restart is not None:
        try:
            conn.restart(restart, timeout=120)
        except (ServerError, TimeoutError) as exc:
            st.session_state["preset_error"] = f"The restart was refused: {exc}"
            return
        conn.wait_live(timeout=30)
    view = conn.view()
    workload = PRESETS[key](view.config or {}, Tokens(token_counter_for(view.config)))
    runner = PresetRunner(conn, feed(), workload).start()
    st.session_state.setdefault("submit_runners", []).insert(0, runner)
    st.toast(f"{workload.name}: submitting {workload.size} request(s)")


def _presets() -> None:
    view = connection().view()
    live = view.status == "live"
    if not live:
        st.info(f"Waiting for the engine ({view.status})… presets unlock when it is live.")
    if msg := st.session_state.pop("preset_error", None):
        st.error(msg)
    tokens = Tokens(token_counter_for(view.config))
    cols = st.columns(len(PRESETS))
    for col, (key, build) in zip(cols, PRESETS.items()):
        workload = build(view.config or {}, tokens)
        with col.container(border=True):
            st.markdown(f"**{workload.name}**")
            st.caption(f"{workload.size} request{'s' if workload.size > 1 else ''}, about "
                       f"{workload.estimate_s:.0f} s here. {workload.watch}")
            with st.expander("The rule at work"):
                st.caption(workload.rule)
            if workload.restart is not None:
                opts = ", ".join(f"{k} {v}" for k, v in workload.restart.items())
                st.caption(f"This engine cannot show it in time: {workload.restart_why}. "
                           f"One click restarts it with {opts} (a new run), then runs it.")
                label = "Restart and run"
            else:
                label = "Run preset"
            st.button(label, key=f"preset_{key}", width="stretch", disabled=not live,
                      on_click=_run, args=(key, workload.restart))


def _abort_mine() -> None:
    conn = connection()
    ids = [r for r in session_request_ids(MY_REQUESTS)
           if (p := conn.outputs(r)) is not None and p.finished is None and p.error is None]
    for rid in ids:
        try:
            conn.abort(rid)
        except ServerError:
            pass  # finished meanwhile
    st.toast(f"Aborting {len(ids)} request{'' if len(ids) == 1 else 's'} of this page."
             if ids else "None of this page's requests is running.")


def _api_snippets() -> None:
    """Copy-paste clients for this server's OpenAI API: their requests show up here too."""
    # The name the API answers to (--served-model-name, else --model), as /healthz says it.
    health = probe_health(settings().health_url) or {}
    model = health.get("served_model_name") or settings().model
    token = envs.TOKEN.get() is not None
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
        head, mine, everyone = st.columns([1.4, 1, 1])
        head.subheader("Outputs (streaming)")
        mine.button("Abort mine", key="submit_abort_mine", on_click=_abort_mine,
                    help="Abort the requests this page submitted that are still running.")
        everyone.button("Abort everything", key="submit_abort_all", on_click=abort_everything,
                        help="Abort every request on the engine, whoever submitted it.")
        with st.container(height=560, border=False):
            st.fragment(run_every=0.5)(render_outputs)(MY_REQUESTS)


page()

"""Attached: a vLLM / SGLang / kvscope deployment's prefix cache, through ``kvscope attach``.

Live when this dashboard is connected to ``kvscope attach``; otherwise a stored attached
run at its last step (the Replay page steps through it with the slider), and how to
attach.
"""

from __future__ import annotations

import streamlit as st

from engine.store.runs import RunStore

from dashboard.attached_frame import AttachedFrame
from dashboard.attached_view import render_attached_view
from dashboard.connection import attached, connection, feed, settings
from dashboard.stored_runs import load_run, run_label

HOW = """
Point kvscope at a deployment's KV cache events (one `--kv-events` per pod):

```
kvscope attach --kv-events tcp://POD:5557 --replay tcp://POD:5558 \\
               --metrics http://POD:8000/metrics --tokenizer /path/to/model
KVSCOPE_URL=ws://127.0.0.1:8766 streamlit run dashboard
```

vLLM publishes them with `--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}' --enable-prefix-caching`;
SGLang with `--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'`. See the README's "Attach to vLLM or SGLang".
"""


def _live() -> None:
    view = connection().view()
    f = feed()
    frame = f.frame(view, f.poll(view))
    if not isinstance(frame, AttachedFrame):
        st.info("Waiting for the attach server's first snapshot…")
        return
    render_attached_view(frame)


def _stored() -> None:
    store = RunStore()
    runs = [r for r in store.list_runs() if r.get("kind") == "attached" and r.get("num_steps")]
    st.markdown(HOW)
    if not runs:
        st.info(f"No attached run is stored in `{store.path}` yet.")
        return
    by_id = {r["id"]: r for r in runs}
    rid = st.selectbox("Stored attached run", list(by_id), key="attached_run",
                       format_func=lambda i: run_label(by_id[i]))
    sr = load_run(store, by_id[rid])
    st.caption(f"Its last step ({sr.steps[-1]}); step through it on the Replay page.")
    render_attached_view(sr.frame(len(sr.records) - 1))


def page() -> None:
    st.title("Attached: a deployment's prefix cache")
    if attached():
        paused = st.toggle("Pause updates", key="attached_paused")
        st.fragment(run_every=None if paused else settings().refresh_s)(_live)()
    else:
        _stored()


page()

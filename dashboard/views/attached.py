"""Attached: a vLLM / SGLang / kvscope deployment's prefix cache, through ``kvscope attach``.

Live when this dashboard is connected to ``kvscope attach``; otherwise a stored attached
run at its last step (the Replay page steps through it with the slider), and how to
attach.
"""

from __future__ import annotations

from dashboard.attached_page import attached_page
from dashboard.attached_view import render_attached_view

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


attached_page("Attached: a deployment's prefix cache", "attached",
              lambda frame, now, live: render_attached_view(frame), HOW)

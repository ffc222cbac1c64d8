"""``kvscope attach``: a foreign engine's KV cache events and metrics as a kvscope run.

vLLM, SGLang (and kvscope itself) publish their prefix cache as a hash-only event
stream (``engine.kv_events`` decodes it). Attach mode subscribes, records the stream
as a run of kind ``attached`` and re-serves it over kvscope's websocket protocol, so
the dashboard and ``kvscope replay`` work on it as on a kvscope engine.

- ``pod_source``: ``PodSource``, one pod's endpoints (events, replay, metrics, topic).
- ``seq_tracker``: sequence numbers → next / gap / duplicate / restart (pure).
- ``stream_items``: what a subscription hands the worker (batches, holes, segments).
- ``subscription``: one pod's ZMQ SUB socket, gap filling through a DEALER on replay.
- ``translate``: decoded batches → kvscope's ``kv_*`` events.
- ``prom_scrape``: Prometheus text → usage, hit rate, queue, TTFT, preemptions (pure).
- ``scraper``: one pod's ``/metrics``, every second, on a thread.
- ``worker``: the thread that turns items into steps: fold, record, publish.
- ``server``: the front door (``engine.server.port.front_door``) around the worker.
- ``attach_metrics``: its ``/metrics``: what arrived per pod, holes, cached blocks.
- ``prefix_match``: the longest cached prefix of a prompt on a pod, by hash or tokens.
- ``ledger``: the fold plus what it forgets: removals (when, why), churn, event oddities.
- ``locator``: a prompt → per pod and tier the cached prefix and why its chain breaks.
- ``routes``: the attach server's ``POST /locate`` and ``GET /wire``.
- ``wire``: a batch's dialect (encoding, hash kind, frames, field set); the wire doctor's rows.
- ``fleet``: one pod's row (fidelity, churn) from its subscription, fold and ledger.
- ``tokenizer_file``: ``--tokenizer`` PATH or model dir → its ``tokenizer.json``.
- ``commands``: the ``kvscope attach`` command.

This ``__init__`` imports nothing, so the dashboard can import ``prefix_match``
without pulling in ZMQ.
"""

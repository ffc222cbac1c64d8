"""Plain Python (no torch, no streamlit): what the engine publishes and what reads it.

- ``schema``: the wire: event types (protocol v2), ``StepRecord``, JSON text, hash keys,
  ``RequestStatus``, the upgrade of protocol v1 recordings.
- ``metrics``: per-step metrics, event counts, pool summaries, per-request stats, block
  residency.
- ``folds``: the reducers (``PoolState`` and its rules, ``HashCacheState``), the snapshots
  they fold into, the prefix tree, which fold replays which run kind.
- ``baseline``: the what-if: the paged run's schedule replayed on a contiguous allocator.
- ``redact`` (token-free copies for watchers), ``render`` (a snapshot as text),
  ``versions`` (which vLLM each behaviour follows, for lessons and pages).

Each sub-package imports only those before it in this list (tests/events/test_purity.py).
"""

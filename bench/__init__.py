"""Benchmarks (not tests): kvscope vs transformers' static batching on the CPU, and the
GPU checks. ``kvscope bench`` is the entry point (bench/commands.py)."""

# ``python -m bench.<script>`` imports this package before the script imports torch:
# give those runs the engine's OpenMP wait policy too (libgomp reads it once, at load)
from engine.cpu_threads import set_default_wait_policy  # noqa: E402

set_default_wait_policy()

"""Benchmarks (not tests): kvscope vs transformers' static batching on the CPU, and the
GPU checks. ``kvscope bench`` is the entry point (bench/commands.py)."""

# ``python -m bench.<script>`` imports this package before the script imports torch:
# decide the OpenMP wait policy of an offline run now (libgomp reads it once, at load);
# under ``kvscope bench`` engine.cli.main has decided already and this does nothing
from engine.cpu_threads import set_default_wait_policy  # noqa: E402

set_default_wait_policy("offline")

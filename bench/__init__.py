"""Benchmarks (not tests): kvscope vs transformers' static batching on the CPU, and the
GPU checks. ``kvscope bench`` is the entry point (bench/commands.py)."""

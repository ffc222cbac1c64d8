"""``kvscope simulate``: what-if runs of the real engine core on request traces.

trace.py (the four trace sources), pod.py (one simulated engine: the real Scheduler and
KV cache manager, a virtual clock, no model), routers/ (one module per real router),
cost.py (the step-cost model), simulation.py (the event loop), report.py (the figures),
commands.py (the CLI). Torch-free. docs/simulate.md says what is modelled and how.
"""

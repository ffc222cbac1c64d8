"""How long the default model takes to load, as measured, for the pages that wait on it.

Measured on the project's 2-core CPU box (load average ~6 from other jobs), from
starting ``kvscope serve`` to ``/healthz`` saying ready: the first start, with an
empty cache (``KVSCOPE_CACHE``), dequantizes SmolLM2's GGUF and caches the float
weights; later starts load the cached weights. Re-measure with the commands in
``measure_command`` when the loader changes, and update the figures here and in
the README together.
"""

from __future__ import annotations

MODEL = "smollm2-135m"
COLD_S = 65  # first start: dequantize + cache (measured 65 s)
CACHED_S = 20  # later starts (measured 19-22 s)
MEASURED_ON = "the 2-core CPU box under a load average of ~6 (2026-12-01)"


def loading_note() -> str:
    """One sentence for a page that waits for the engine to load."""
    return (f"Measured for {MODEL} on {MEASURED_ON}: the first start takes about "
            f"{COLD_S} s (it dequantizes the weights once and caches them), later starts "
            f"about {CACHED_S} s.")


def measure_command(port: int = 18761) -> str:
    """The shell line that measures one start (run it twice: cold, then cached)."""
    return (f"start=$(date +%s.%N); kvscope serve --port {port} & while ! curl -s "
            f"http://127.0.0.1:{port}/healthz | grep -q ready; do sleep 0.2; done; "
            "echo $(echo \"$(date +%s.%N) - $start\" | bc) s")

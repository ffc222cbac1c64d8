"""engine.events and engine.store stay plain Python: no torch, no streamlit."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_events_and_store_import_neither_torch_nor_streamlit():
    code = ("import sys, engine.events.reducer, engine.events.metrics, engine.events.baseline, "
            "engine.events.render, engine.events.step, engine.store, engine.store.commands; "
            "bad = [m for m in ('torch', 'streamlit') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)

"""The dashboard never imports torch, transformers or the model side of the engine.

A subprocess blocks those imports, imports every dashboard module, then runs every
page with AppTest (pages import more as they render) and checks sys.modules.
"""

from __future__ import annotations

import subprocess
import sys

from tests.dashboard.conftest import ROOT, free_port

SCRIPT = r"""
import importlib, pkgutil, sys
BLOCKED = ("torch", "transformers", "engine.model", "engine.llm", "engine.llm_engine")

class Block:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError(f"{name} is blocked: the dashboard must not import it")

sys.meta_path.insert(0, Block())
import dashboard
for m in pkgutil.walk_packages(dashboard.__path__, "dashboard."):
    if not m.name.startswith("dashboard.views"):  # page scripts run below, in AppTest
        importlib.import_module(m.name)
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("dashboard/streamlit_app.py", default_timeout=60).run()
assert not at.exception, at.exception
for page in ("submit", "replay", "compare", "lessons", "engine_settings"):
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, (page, at.exception)
bad = [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)]
assert not bad, bad
import streamlit as st
st.cache_resource.clear()
print("ok")
"""


def test_dashboard_imports_no_torch(tmp_path):
    env = {"KVSCOPE_URL": f"ws://127.0.0.1:{free_port()}", "KVSCOPE_AUTOSTART": "0",
           "KVSCOPE_DB": str(tmp_path / "runs.sqlite"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")

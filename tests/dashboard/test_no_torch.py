"""The dashboard never imports torch, transformers or the model side of the engine,
and neither do the clients it uses (engine.client, engine.protocol).

A subprocess blocks those imports, imports every module of the clients and the
dashboard, then runs every page with AppTest (pages import more as they render) and
checks sys.modules. The dashboard also never reads the store's tables itself.
"""

from __future__ import annotations

import ast
import re
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
import engine.client, engine.protocol
for pkg in (engine.client, engine.protocol):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
import dashboard
for m in pkgutil.walk_packages(dashboard.__path__, "dashboard."):
    if not m.name.startswith("dashboard.views"):  # page scripts run below, in AppTest
        importlib.import_module(m.name)
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("dashboard/streamlit_app.py", default_timeout=60).run()
assert not at.exception, at.exception
for page in ("submit", "replay", "attached", "compare", "lessons", "engine_settings"):
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


SQL = re.compile(r"\b(select|insert|update|delete|create)\b.+\b(from|into|set|table|where)\b", re.I)
DRIVERS = ("sqlite3", "sqlite_utils")
WHERE_NOT_WHAT = {"resolve_db_path", "is_uri"}  # engine.store.db names that say where the file is


def test_dashboard_does_not_know_the_store_schema():
    """Stored runs come through engine.store's public API (RunStore), live gaps through
    the server (steps_since): no SQL, no table names, no sqlite in the dashboard."""
    offenders = []
    for path in sorted((ROOT / "dashboard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                offenders += [f"{where}: imports {a.name}" for a in node.names
                              if a.name.split(".")[0] in DRIVERS]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.split(".")[0] in DRIVERS or module == "engine.store.recorder" or (
                        module == "engine.store.db"
                        and {a.name for a in node.names} - WHERE_NOT_WHAT):
                    offenders.append(f"{where}: imports from {module}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
                offenders.append(f"{where}: SQL {node.value[:40]!r}")
            elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                  and node.slice.value in ("runs", "steps", "requests")
                  and isinstance(node.value, ast.Name) and node.value.id in ("d", "db")):
                offenders.append(f"{where}: table {node.slice.value!r}")
    assert not offenders, offenders

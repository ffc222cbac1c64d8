"""Fixtures for the dashboard tests: a stored-runs database and a real server (tiny model).

The server runs as ``python -m engine.cli serve`` in a subprocess on a free port, as a
user would start it; every fixture stops what it started. Streamlit's process-wide
resources (the websocket client thread, a server child) are released after each
module so no thread outlives its server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dashboard.server_process import probe_health, stop_process
from tests.dashboard.fake_runs import record_run

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "streamlit_app.py"
SERVE_ARGS = ("--num-kv-blocks", "256", "--block-size", "4", "--max-model-len", "256")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(health_url: str, timeout: float = 120.0, proc=None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        h = probe_health(health_url)
        if h and h.get("status") == "ready":
            return h
        if h and h.get("status") == "error":
            raise RuntimeError(f"server failed: {h}")
        time.sleep(0.2)
    raise TimeoutError(f"server at {health_url} not ready in {timeout}s")


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from tests.tiny_models import tiny_model_dir

    return str(tiny_model_dir("llama"))


class Server:
    """A ``kvscope serve`` subprocess on a free port."""

    def __init__(self, model: str, db: str, extra=SERVE_ARGS) -> None:
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.health_url = f"http://127.0.0.1:{self.port}/healthz"
        self.db = db
        self.log = open(Path(db).with_suffix(f".{self.port}.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "serve", "--model", model, "--port",
             str(self.port), "--db", db, *extra], cwd=ROOT, stdout=self.log,
            stderr=subprocess.STDOUT, env={**os.environ, "KVSCOPE_DB": db})
        try:
            wait_ready(self.health_url, proc=self.proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.proc, timeout=20)
        self.log.close()


@pytest.fixture(scope="module")
def server_db(tmp_path_factory) -> str:
    """A runs database holding two fake runs (for Replay/Compare) the server also records to."""
    db = str(tmp_path_factory.mktemp("runs") / "runs.sqlite")
    record_run(db, label="fake pool 20 (pressure)", num_blocks=20)
    record_run(db, label="fake pool 48", num_blocks=48)
    return db


@pytest.fixture(scope="module")
def live_server(tiny_model, server_db):
    s = Server(tiny_model, server_db)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def dashboard_env(live_server):
    """Point the in-process dashboard (AppTest) at the server; release its resources after."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVSCOPE_URL", live_server.url)
    mp.setenv("KVSCOPE_DB", live_server.db)
    mp.setenv("KVSCOPE_AUTOSTART", "0")
    yield live_server
    release_streamlit_resources()
    mp.undo()


def release_streamlit_resources() -> None:
    """Run every st.cache_resource on_release (stops client threads and server children)."""
    import streamlit as st

    st.cache_resource.clear()

"""With no server at KVSCOPE_URL the dashboard starts one, shows its loading, then
follows it live; releasing Streamlit's resources (dashboard exit) stops it."""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import connection
from tests.dashboard.conftest import APP, free_port, release_streamlit_resources


@pytest.fixture
def autostart_env(monkeypatch, tmp_path, tiny_model):
    port = free_port()
    monkeypatch.setenv("KVSCOPE_URL", f"ws://127.0.0.1:{port}")
    monkeypatch.setenv("KVSCOPE_AUTOSTART", "1")
    monkeypatch.setenv("KVSCOPE_MODEL", tiny_model)
    monkeypatch.setenv("KVSCOPE_DB", str(tmp_path / "runs.sqlite"))
    monkeypatch.setenv("KVSCOPE_SERVE_ARGS", "--num-kv-blocks 64 --block-size 4 "
                                             "--max-model-len 128")
    yield port
    release_streamlit_resources()


def _run_until(at: AppTest, pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred(at):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
        at.run()
        assert not at.exception, [e.value for e in at.exception]


def test_dashboard_starts_a_server_and_stops_it_at_exit(autostart_env):
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    proc = connection.server_status().managed
    assert proc is not None and proc.alive() and str(autostart_env) in proc.cmd
    assert "--num-kv-blocks" in proc.cmd
    # The sidebar renders before the page; on the run where the page first goes live the
    # sidebar may still show the loading state, so wait for both.
    _run_until(at, lambda a: any(m.label == "blocks used" for m in a.metric)
               and any("64 blocks" in c.value for c in a.caption), 120,
               "the started server to go live, page and sidebar")
    assert any("64 blocks" in c.value for c in at.caption)  # sidebar: the started engine
    release_streamlit_resources()  # what Streamlit does on exit / cache clear
    assert proc.proc.wait(30) is not None
    assert not proc.alive()


def test_a_server_that_fails_to_load_is_reported(monkeypatch, autostart_env):
    monkeypatch.setenv("KVSCOPE_MODEL", "/nonexistent/model")
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    _run_until(at, lambda a: any("server failed" in e.value for e in a.error), 90,
               "the load error")

"""Servers for the server tests: real KVScopeServers on free loopback ports.

Each ``make_server(...)`` starts one in this process (a thread for asyncio, a
thread for the engine) on the tiny Llama, recording into the test's own SQLite
file, and stops it when the test ends. Its engine core runs as ``kvscope serve``
runs it, in a process of its own; a test that looks into the core
(``server.worker.engine.engine_core``) asks for it here with ``core_here=True``.
"""

from __future__ import annotations

import threading

import pytest
import torch

from engine.config import EngineConfig
from engine.server.app import KVScopeServer, ServerOptions
from tests.tiny_models import tiny_model_dir

# The tiny model's forward is microseconds of math; with torch's default intra-op
# threads on a shared 2-core box each step costs 10-100x more in thread handoffs.
torch.set_num_threads(1)

# num_threads=1 also in the core's own process (this module's set_num_threads is not there)
ENGINE = dict(block_size=4, num_kv_blocks=64, max_model_len=64, max_num_batched_tokens=64, num_threads=1)


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    return str(tiny_model_dir("llama"))


@pytest.fixture
def db_path(tmp_path) -> str:
    return str(tmp_path / "runs.sqlite")


@pytest.fixture
def make_server(tiny_llama, db_path):
    started: list[KVScopeServer] = []

    def make(engine: dict | None = None, ready: bool = True, core_here: bool = False,
             **options) -> KVScopeServer:
        cfg = EngineConfig(**{"model": tiny_llama, **ENGINE, "engine_core_process": not core_here,
                              **(engine or {})})
        options.setdefault("db", db_path)
        server = KVScopeServer(ServerOptions(cfg, port=0, **options)).start()
        started.append(server)
        if ready:
            health = server.wait_ready(60)
            assert health.status.value == "ready", health
        return server

    yield make
    for server in started:
        server.stop()
        assert not server._thread.is_alive(), "server thread did not stop"


class Gate:
    """An engine factory that waits for ``open()`` before loading: a deterministic
    'still loading' window for the tests."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def open(self) -> None:
        self.event.set()

    def __call__(self, cfg):
        from engine.llm_engine import build_engine

        if not self.event.wait(60):
            raise TimeoutError("gate never opened")
        return build_engine(cfg)

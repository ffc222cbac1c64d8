"""The CPU thread policy (engine/cpu_threads.py): thread-count precedence, and the
OpenMP wait policy set before torch loads libgomp."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import cpu_threads
from engine.config import EngineConfig
from engine.core import ConfigError

_VARS = ("KVSCOPE_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@pytest.fixture
def clean_env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_thread_count_precedence(clean_env):
    cores = cpu_threads.usable_cores()
    assert cpu_threads.thread_count() == cores  # offline: every usable core
    clean_env.setattr(cpu_threads, "SERVE_THREADS", 1)
    assert cpu_threads.thread_count(serving=True) == 1
    assert cpu_threads.thread_count() == cores
    clean_env.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads.thread_count() is None  # left to torch, which read it
    clean_env.setenv("KVSCOPE_NUM_THREADS", "2")
    assert cpu_threads.thread_count(serving=True) == 2
    assert cpu_threads.thread_count(5) == 5  # EngineConfig.num_threads wins over all
    clean_env.setenv("KVSCOPE_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="KVSCOPE_NUM_THREADS"):
        cpu_threads.thread_count()
    with pytest.raises(ValueError, match="num_threads"):
        cpu_threads.thread_count(0)
    with pytest.raises(ConfigError, match="num_threads"):
        EngineConfig(num_threads=0)


def test_configure_cpu_threads_sets_torch(clean_env):
    import torch

    from engine.startup import configure_cpu_threads

    before = torch.get_num_threads()
    try:
        assert configure_cpu_threads(1) == 1 == torch.get_num_threads()
        clean_env.setenv("KVSCOPE_NUM_THREADS", "-1")
        with pytest.raises(ConfigError, match="KVSCOPE_NUM_THREADS"):
            configure_cpu_threads()
    finally:
        torch.set_num_threads(before)


def test_wait_policy_is_set_only_before_torch_and_only_if_not_exported(clean_env):
    clean_env.setattr(cpu_threads, "WAIT_POLICY_ENV", {"OMP_WAIT_POLICY": "PASSIVE"})
    clean_env.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert not cpu_threads.set_default_wait_policy()  # torch already loaded: too late
    clean_env.delitem(sys.modules, "torch")
    clean_env.setenv("GOMP_SPINCOUNT", "1000")
    assert not cpu_threads.set_default_wait_policy()  # the user's setting wins
    assert "OMP_WAIT_POLICY" not in os.environ
    clean_env.delenv("GOMP_SPINCOUNT")
    assert cpu_threads.set_default_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    return {**env, **extra}


@pytest.mark.parametrize("exported", [{}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_importing_engine_applies_the_default_in_a_fresh_process(exported):
    code = "import os, engine, torch; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=_child_env(exported), capture_output=True,
                         text=True, check=True).stdout.split()
    if exported:
        assert out == ["ACTIVE", "None"]
    else:
        want = cpu_threads.WAIT_POLICY_ENV or {}
        assert out == [want.get("OMP_WAIT_POLICY", "None"), want.get("GOMP_SPINCOUNT", "None")]

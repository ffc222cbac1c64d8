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


def test_the_wait_policy_per_use():
    # serve: PASSIVE whatever the load; offline: spin only with a core free per thread
    assert cpu_threads.wait_policy_for("serve", 0.0, 2, 2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_threads.wait_policy_for("offline", 0.3, 2, 2) is None
    assert cpu_threads.wait_policy_for("offline", 0.5, 2, 2) is None
    assert cpu_threads.wait_policy_for("offline", 0.6, 2, 2) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert cpu_threads.wait_policy_for("offline", 1.4, 1, 2) is None  # one thread, a core spare
    assert cpu_threads.wait_policy_for("offline", 3.0, 16, 16) == {"OMP_WAIT_POLICY": "PASSIVE"}
    with pytest.raises(ValueError, match="use must be one of"):
        cpu_threads.wait_policy_for("notebook", 0.0, 1, 1)


def test_wait_policy_is_decided_once_before_torch_and_never_over_an_export(clean_env):
    clean_env.setattr(cpu_threads, "decision", None)
    clean_env.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    clean_env.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert not cpu_threads.set_default_wait_policy("serve")  # torch already loaded: too late
    clean_env.delitem(sys.modules, "torch")
    clean_env.setenv("GOMP_SPINCOUNT", "1000")
    assert not cpu_threads.set_default_wait_policy("serve")  # the user's setting wins
    assert "OMP_WAIT_POLICY" not in os.environ
    clean_env.delenv("GOMP_SPINCOUNT")
    assert cpu_threads.set_default_wait_policy("offline")  # idle box: libgomp's spin
    assert "OMP_WAIT_POLICY" not in os.environ and cpu_threads.decision.startswith("offline: libgomp spin")
    assert not cpu_threads.set_default_wait_policy("serve")  # decided already: the first wins
    clean_env.setattr(cpu_threads, "decision", None)
    assert cpu_threads.set_default_wait_policy("serve")
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and cpu_threads.decision.startswith("serve: ")
    clean_env.delenv("OMP_WAIT_POLICY")
    clean_env.setattr(cpu_threads, "decision", None)
    clean_env.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    assert cpu_threads.set_default_wait_policy("offline")  # a busy box: PASSIVE offline too
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    return {**env, **extra}


_REPORT = ("import os, sys; from engine import cpu_threads; {before}; import torch; "
           "print(os.environ.get('OMP_WAIT_POLICY'), cpu_threads.decision is not None)")


@pytest.mark.parametrize("exported", [{}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_the_entry_points_decide_before_torch_loads_in_a_fresh_process(exported):
    def run(before: str) -> list[str]:
        return subprocess.run([sys.executable, "-c", _REPORT.format(before=before)],
                              env=_child_env(exported), capture_output=True, text=True,
                              check=True).stdout.split()

    serve = run("from engine.cli import _use; cpu_threads.set_default_wait_policy(_use(['-v', 'serve']))")
    offline = run("from engine import LLM")
    bare = run("import engine")  # importing the package decides nothing
    if exported:
        assert serve == offline == bare == ["ACTIVE", "False"]
    else:
        assert serve == ["PASSIVE", "True"]
        assert offline[1] == "True" and offline[0] in ("PASSIVE", "None")  # as the load says
        assert bare == ["None", "False"]


def test_the_cli_decides_serve_for_serve_and_offline_for_the_rest():
    from engine.cli import _use

    assert _use(["serve", "--port", "0"]) == "serve"
    assert _use(["-v", "serve"]) == "serve"
    assert _use(["bench", "--quick"]) == "offline"
    assert _use(["generate", "serve"]) == "offline"  # a prompt that says serve

"""The CPU thread policy (engine/cpu_threads.py): thread-count precedence, and the
OpenMP wait policy set before torch loads libgomp."""

from __future__ import annotations

import os
import subprocess
import time
import sys

import pytest

from engine import cpu_threads
from engine.config import EngineConfig
from engine.core import ConfigError

_VARS = ("KVSCOPE_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT",
         "KVSCOPE_ADAPT_THREADS", "KVSCOPE_SERVE_THREADS")


@pytest.fixture
def clean_env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_thread_count_precedence(clean_env):
    cores = cpu_threads.usable_cores()
    assert cpu_threads.thread_count() == cores  # offline: every usable core
    clean_env.setenv("KVSCOPE_SERVE_THREADS", "1")
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

    from engine.engine_core.startup import configure_cpu_threads

    before = torch.get_num_threads()
    try:
        assert configure_cpu_threads(1) == 1 == torch.get_num_threads()
        clean_env.setenv("KVSCOPE_NUM_THREADS", "-1")
        with pytest.raises(ConfigError, match="KVSCOPE_NUM_THREADS"):
            configure_cpu_threads()
    finally:
        torch.set_num_threads(before)


def test_wait_policy_is_set_only_before_torch_and_only_if_not_exported(clean_env):
    assert cpu_threads.WAIT_POLICY_ENV == {"GOMP_SPINCOUNT": "10000"}  # the measured winner
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
def test_the_kvscope_command_applies_the_default_in_a_fresh_process(exported):
    # importing engine sets nothing (tests/test_envs.py); kvscope's main() does, before torch
    code = ("import os, engine.cli\ntry:\n    engine.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "import torch\nprint(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=_child_env(exported), capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1].split()  # after --help's text
    if exported:
        assert out == ["ACTIVE", "None"]
    else:
        want = cpu_threads.WAIT_POLICY_ENV or {}
        assert out == [want.get("OMP_WAIT_POLICY", "None"), want.get("GOMP_SPINCOUNT", "None")]


# ---- the CoreGovernor: exact decisions on fake clocks and CPU counters --------------

class _Box:
    """A fake clock, /proc/stat busy seconds over our CPUs and our own CPU seconds."""

    def __init__(self) -> None:
        self.t, self.box, self.own, self.threads, self.set = 0.0, 0.0, 0.0, 2, []

    def run(self, gov, seconds: float, others: float, step_s: float = 0.05) -> None:
        """Steps back to back for ``seconds``: we use ``threads`` cores, others ``others``."""
        end = self.t + seconds
        while self.t < end - 1e-9:
            gov.tick()
            self.t += step_s
            self.own += self.threads * step_s
            self.box += (self.threads + others) * step_s
            gov.stepped()

    def apply(self, n: int) -> None:
        self.set.append(n)
        self.threads = n


def _governor(box: _Box, **kw) -> cpu_threads.CoreGovernor:
    return cpu_threads.CoreGovernor(2, cpus=(0, 1), clock=lambda: box.t, box=lambda cpus: box.box,
                                    own=lambda: box.own, apply=box.apply, current=lambda: box.threads, **kw)


def test_governor_gives_up_a_core_while_another_job_holds_one_and_takes_it_back():
    box = _Box()
    gov = _governor(box)
    box.run(gov, 1.0, others=0.0)
    assert box.set == [] and gov.others == 0.0  # a quiet box: both cores stay ours
    box.run(gov, 0.75, others=1.0)
    assert box.set == [1] and gov.others == pytest.approx(1.0)  # a busy-loop job: one thread
    box.run(gov, 1.0, others=1.0)
    assert box.set == [1]  # measured at 1 thread, the job still holds its core
    box.run(gov, 0.75, others=0.0)
    assert box.set == [1, 2] and gov.changes == 2  # the job ended: the second core again


def test_governor_hysteresis_between_half_a_core_and_a_third():
    box = _Box()
    gov = _governor(box)
    box.run(gov, 1.0, others=0.45)  # under half a core elsewhere: keep 2
    assert box.set == []
    box.run(gov, 0.75, others=0.6)  # over half: down
    assert box.set == [1]
    box.run(gov, 1.0, others=0.4)  # between 0.3 and 0.5: stay at 1
    assert box.set == [1]
    box.run(gov, 0.75, others=0.2)  # under 0.3: up
    assert box.set == [1, 2]


def test_governor_ignores_what_others_did_while_the_engine_was_idle():
    box = _Box()
    gov = _governor(box)
    box.run(gov, 0.2, others=0.0)
    box.t += 5.0  # the engine idles 5 s while another job uses both cores
    box.box += 2 * 5.0
    box.run(gov, 1.0, others=0.0)
    assert box.set == [] and gov.others == 0.0  # the pause restarted the window


def test_governor_decide_on_more_cores():
    box = _Box()
    gov = cpu_threads.CoreGovernor(8, cpus=range(8), apply=box.apply, current=lambda: box.threads)
    box.threads = 8
    assert gov.decide(3.0) == 5  # floor(5 + 0.5)
    assert gov.decide(0.0) == 8  # floor(8 + 0.3), at most max_threads
    assert gov.decide(7.9) == 1  # never below one thread
    assert box.set == [5, 8, 1]


def test_governor_only_for_the_default_count(clean_env):
    from engine.engine_core.startup import cpu_governor

    multi = cpu_threads.usable_cores() >= 2
    assert (cpu_governor() is not None) == multi
    assert cpu_governor(2) is None  # EngineConfig.num_threads
    clean_env.setenv("KVSCOPE_NUM_THREADS", "2")
    assert cpu_governor() is None
    clean_env.delenv("KVSCOPE_NUM_THREADS")
    clean_env.setenv("OMP_NUM_THREADS", "2")
    assert cpu_governor() is None
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.setenv("KVSCOPE_ADAPT_THREADS", "0")
    assert cpu_governor() is None


def test_serve_fixes_no_count_of_its_own_unless_serve_threads_says(clean_env):
    # kvscope serve puts serving_count() into EngineConfig.num_threads: None leaves the
    # engine its default count, governed as offline
    assert cpu_threads.serving_count() is None
    clean_env.setenv("KVSCOPE_SERVE_THREADS", "1")
    assert cpu_threads.serving_count() == 1
    clean_env.setenv("KVSCOPE_SERVE_THREADS", str(10**6))
    assert cpu_threads.serving_count() == cpu_threads.usable_cores()  # never past the cores
    clean_env.setenv("KVSCOPE_SERVE_THREADS", "none")
    with pytest.raises(ValueError, match="KVSCOPE_SERVE_THREADS"):
        cpu_threads.serving_count()
    clean_env.setenv("KVSCOPE_SERVE_THREADS", "1")
    clean_env.setenv("KVSCOPE_NUM_THREADS", "2")
    assert cpu_threads.serving_count() is None  # the environment's count: build_engine reads it


def test_box_busy_reads_proc_stat():
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    a = cpu_threads.box_busy_s(cpu_threads._affinity())
    t = time.monotonic()
    while time.monotonic() - t < 0.3:  # keep one core busy
        pass
    b = cpu_threads.box_busy_s(cpu_threads._affinity())
    assert b - a >= 0.2  # this process's busy loop shows in the box's counters
    assert cpu_threads.box_busy_s([10**6]) == 0.0  # a CPU not on this box: nothing


def test_each_step_of_a_cpu_engine_drives_its_governor(tiny_llama, clean_env):
    from engine.core import SamplingParams
    from engine.llm_engine import build_engine

    fixed = build_engine(EngineConfig(model=tiny_llama, num_threads=1, num_kv_blocks=32))
    assert fixed.engine_core.governor is None  # an explicit count is never adjusted
    engine = build_engine(EngineConfig(model=tiny_llama, num_kv_blocks=32))
    if cpu_threads.usable_cores() < 2:
        assert engine.engine_core.governor is None
        return
    calls = []

    class Spy:
        def tick(self):
            calls.append("tick")

        def stepped(self):
            calls.append("stepped")

    engine.engine_core.governor = Spy()
    engine.add_request(prompt=[1, 2, 3], params=SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    n = 0
    while engine.has_unfinished_requests():
        engine.step()
        n += 1
    assert n >= 3 and calls == ["tick", "stepped"] * n  # around the forward of every step

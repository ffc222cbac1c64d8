"""Where the C++ kernels are built, and torch's build lock.

torch's ``cpp_extension.load`` takes a ``lock`` file in the build directory on every call
and waits for as long as one exists. A process killed while holding it (a stopped session,
a test that kills a loading engine core) left one behind, and every later engine start
hung: the last CI waited in ``make install`` until its 90 minutes ran out."""

import os
import subprocess
import sys
import time
from pathlib import Path

from kernels import cpu_build

ROOT = Path(__file__).resolve().parents[2]


def test_a_virtualenv_builds_in_its_own_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    d = cpu_build.build_directory("kvscope_x")
    assert d == str(tmp_path / "venv" / "kvscope-kernels" / "kvscope_x") and Path(d).is_dir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # the operator's wins
    assert cpu_build.build_directory("kvscope_x") == str(tmp_path / "ext" / "kvscope_x")


def test_only_a_lock_older_than_any_build_is_removed(tmp_path):
    lock = tmp_path / "lock"
    assert cpu_build.clear_stale_lock(str(tmp_path)) is False  # none there
    lock.touch()
    assert cpu_build.clear_stale_lock(str(tmp_path)) is False and lock.exists()  # a build running
    old = time.time() - cpu_build.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert cpu_build.clear_stale_lock(str(tmp_path)) is True and not lock.exists()


LOAD = ("import time, sys; from kernels import cpu_build; t = time.monotonic(); "
        "m = cpu_build.load_cpu_extension('cpu_mkl.cpp'); print(m.__name__, round(time.monotonic() - t, 1))")


def _load(env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_built_kernel_loads_past_a_lock_and_a_stale_lock_does_not_stall_a_build(tmp_path, cpu_compiler):
    """Real builds, each in a fresh process, into a directory of the test's own."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    name = "kvscope_cpu_mkl" + ("_omp" if cpu_build.openmp_flags() else "")
    lock = tmp_path / name / "lock"
    lock.parent.mkdir()
    lock.touch()  # a killed build's lock, older than any build
    old = time.time() - 2 * cpu_build.STALE_LOCK_S
    os.utime(lock, (old, old))
    first = _load(env)  # builds
    assert first.returncode == 0, first.stderr
    assert not lock.exists() and (tmp_path / name / cpu_build.STAMP).is_file()
    lock.touch()  # a fresh lock: a process killed just now inside torch's load
    second = _load(env)  # loads the build without waiting on the lock
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[0] == name and lock.exists()

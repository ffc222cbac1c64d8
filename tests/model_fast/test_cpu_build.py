"""Where the C++ kernels are built, and the build lock a killed build leaves behind.

torch's builder waits on a ``lock`` file in the build directory for as long as it exists. A
build killed mid-way left one in the shared ``~/.cache/torch_extensions``, and the next
checkout's ``make install`` waited on it until CI's 90 minutes ran out."""

import os
import sys
import time
from pathlib import Path

from kernels import cpu_build


def test_a_virtualenv_builds_in_its_own_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    d = cpu_build.build_directory("kvscope_x")
    assert d == str(tmp_path / "venv" / "kvscope-kernels" / "kvscope_x") and Path(d).is_dir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # the operator's wins
    assert cpu_build.build_directory("kvscope_x") == str(tmp_path / "ext" / "kvscope_x")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)  # no virtualenv: torch's default
    assert cpu_build.build_directory("kvscope_x") is None


def test_only_a_lock_older_than_any_build_is_removed(tmp_path):
    lock = tmp_path / "lock"
    assert cpu_build.clear_stale_lock(str(tmp_path), "x") is False  # none there
    lock.touch()
    assert cpu_build.clear_stale_lock(str(tmp_path), "x") is False and lock.exists()  # a build running
    old = time.time() - cpu_build.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert cpu_build.clear_stale_lock(str(tmp_path), "x") is True and not lock.exists()


def test_a_stale_lock_does_not_stall_the_build(monkeypatch, tmp_path, cpu_compiler):
    """A real build of a kernel in a fresh directory that holds a killed build's lock."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    name = "kvscope_cpu_mkl" + ("_omp" if cpu_build.openmp_flags() else "")
    lock = tmp_path / name / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = time.time() - 2 * cpu_build.STALE_LOCK_S
    os.utime(lock, (old, old))
    monkeypatch.setattr(cpu_build, "_loaded", {})
    module = cpu_build.load_cpu_extension("cpu_mkl.cpp")
    assert module is not None and not lock.exists()
    assert any(p.suffix == ".so" for p in (tmp_path / name).iterdir())

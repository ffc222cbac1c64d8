"""Build and load the C++ CPU kernels (kernels/*.cpp) with torch's cpp_extension.

Each source is compiled on first use in a process (``-O3 -march=native``, and
``-fopenmp`` where torch's threads are OpenMP's; needs a C++ compiler and ninja; ~30-60 s
the first time), then loaded from its build directory in well under a second. ``make
install`` builds them once ahead of time.

The build directory is the virtualenv's own (``<venv>/kvscope-kernels/<name>``), so each
checkout builds and keeps its kernels apart; ``TORCH_EXTENSIONS_DIR`` overrides it, and
outside a virtualenv torch's ``~/.cache/torch_extensions`` is used.

torch's ``load`` takes a ``lock`` file in that directory on every call, even when nothing
needs building (it runs ninja to find out), and waits for ever while one exists. A process
killed inside that window (a stopped session; a test that kills a loading engine core)
leaves the lock behind, and every later engine start hangs: the last CI hung in ``make
install`` until its 90 minutes ran out. So a finished build writes a stamp (``STAMP``: the
hash of the source, the flags, torch's and Python's versions) and later loads import the
built module directly, taking no lock; only a real build goes through torch, and a lock older
than any build (``STALE_LOCK_S``) is removed first, saying so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import envs

logger = logging.getLogger(__name__)

_loaded: dict[tuple[str, bool], object] = {}  # by (source, OPENMP): torch's backend is fixed per process
_lock = threading.Lock()
_lock_enabled = threading.Lock()


class KernelUnavailableError(RuntimeError):
    """The C++ kernels could not be built or loaded here."""


def missing_compiler() -> str | None:
    """Why the kernels cannot be built here, when that is because no C++ compiler is
    installed (torch's builder runs ``$CXX``, default ``c++``); None when there is one."""
    cxx = envs.CXX.get()
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH (install g++ to build the kernels in kernels/*.cpp)"
    return None


def _ninja_on_path() -> None:
    """torch's extension builder runs ``ninja`` from PATH; the pip-installed one sits next
    to this Python, which is not on PATH unless the virtualenv is activated."""
    bindir = Path(sys.executable).parent
    if shutil.which("ninja") is None and (bindir / "ninja").exists():
        os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"


# A build takes 30-60 s on a 2-core box (a few minutes under load); a lock file older than
# this was left by a build that was killed, and nothing will ever remove it.
STALE_LOCK_S = 600.0
STAMP = "kvscope-build.json"  # written by a finished build: what was built, from what


def build_directory(name: str) -> str:
    """Where extension ``name`` is built and cached: ``TORCH_EXTENSIONS_DIR``/name when set;
    in a virtualenv, ``<venv>/kvscope-kernels/<name>``; else torch's default."""
    root = envs.TORCH_EXTENSIONS_DIR.get()
    if root:
        path = Path(root) / name
    elif sys.prefix != sys.base_prefix:
        path = Path(sys.prefix) / "kvscope-kernels" / name
    else:
        from torch.utils import cpp_extension

        return cpp_extension._get_build_directory(name, False)
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


HEADERS = ("cpu_bf16.h",)  # kernels/ headers the sources include: part of every build's fingerprint


def fingerprint(source: Path, flags: list[str]) -> str:
    """What a build depends on: the source, the flags, the compiler, torch and Python."""
    import torch

    h = hashlib.sha256(source.read_bytes())
    for header in HEADERS:  # what the sources #include from kernels/
        h.update(source.with_name(header).read_bytes())
    h.update(json.dumps([flags, envs.CXX.get(), torch.__version__, sys.version]).encode())
    return h.hexdigest()


def load_built(directory: str, fp: str):
    """The module that a finished build of the same fingerprint left in ``directory``,
    imported without torch's lock (torch is imported first: the module links its libraries);
    None when there is none."""
    try:
        stamp = json.loads((Path(directory) / STAMP).read_text())
        path = Path(directory) / stamp["file"]
        if stamp["fingerprint"] != fp or not path.is_file():
            return None
        spec = importlib.util.spec_from_file_location(stamp["module"], path)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_stamp(directory: str, fp: str, module) -> None:
    tmp = Path(directory) / f".{STAMP}.{os.getpid()}"
    tmp.write_text(json.dumps({"fingerprint": fp, "module": module.__name__,
                               "file": Path(module.__file__).name}))
    tmp.replace(Path(directory) / STAMP)


def clear_stale_lock(directory: str, now: float | None = None) -> bool:
    """Remove the build ``lock`` a killed build left behind (older than ``STALE_LOCK_S``);
    True when one was removed."""
    lock = Path(directory) / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False
    logger.warning("removing %s: a build lock %.0f s old, left by a build that was killed", lock, age)
    lock.unlink(missing_ok=True)
    return True


# Off with KVSCOPE_CPU_OPENMP=0 (and flipped by ``python -m bench.step_ab kernel_openmp``):
# the kernels are then built without -fopenmp, as before issue 19, and run on one thread.
# Read at each load; both builds can live in one process (they have different names).
OPENMP = envs.CPU_OPENMP.get()
_TORCH_OPENMP: bool | None = None  # torch's parallel backend is OpenMP; asked once


def openmp_flags() -> list[str]:
    """``-fopenmp`` when torch's intra-op threads are OpenMP's (the pip wheels' build).

    ``at::parallel_for`` is a header template: compiled without ``-fopenmp`` it runs its
    whole range on the calling thread (ATen/ParallelOpenMP.h defines the parallel path
    only under ``_OPENMP``), so every kernel here ran on one thread while the other
    slept (issue 19: the decode kernel's attention, 12% of a 64-sequence step). The
    extension links ``libgomp.so.1``, which resolves to the copy torch already loaded
    (same soname), so the kernels share torch's thread pool and its wait policy."""
    global _TORCH_OPENMP
    if _TORCH_OPENMP is None:
        import torch

        _TORCH_OPENMP = torch.backends.openmp.is_available()
    return ["-fopenmp"] if OPENMP and _TORCH_OPENMP else []


def load_cpu_extension(source: str, extra_cflags: tuple[str, ...] = ()):
    """The compiled module of ``kernels/<source>`` (built once per machine and flags).

    Raises KernelUnavailableError, saying why, when it cannot be built. Once loaded it is
    one dict read, without the lock: a decode step asks a few times a layer."""
    key = (source, OPENMP)  # OPENMP may be flipped at run time (bench/step_ab.py)
    module = _loaded.get(key)
    if module is not None:
        return module
    omp = openmp_flags()
    with _lock:
        if key not in _loaded:
            from torch.utils import cpp_extension

            _ninja_on_path()
            src = Path(__file__).with_name(source)
            name = f"kvscope_{src.stem}{'_omp' if omp else ''}"  # both builds stay cached
            cflags = ["-O3", "-march=native", *omp, *extra_cflags]
            try:
                directory = build_directory(name)
                fp = fingerprint(src, cflags + omp)
                module = load_built(directory, fp)
                if module is None:
                    clear_stale_lock(directory)
                    module = cpp_extension.load(
                        name=name, sources=[str(src)], build_directory=directory,
                        extra_cflags=cflags, extra_ldflags=omp, verbose=False)
                    _write_stamp(directory, fp, module)
                _loaded[key] = module
            except Exception as exc:  # noqa: BLE001 (compiler missing, build error, ...)
                raise KernelUnavailableError(
                    f"the C++ kernels in kernels/{source} failed to build ({type(exc).__name__}: {exc}); "
                    "they need a C++ compiler and ninja") from exc
        return _loaded[key]


class DefaultPathKernels:
    """A C++ extension that the default path uses where it builds: on unless
    ``env_var=0``; the first ``enabled()`` call decides it for the process (building or
    loading it, and logging once when it cannot). ``on`` is that decision (written only
    by ``enabled``, and by A/B benchmarks and tests that flip it). ``refuses``: given the
    module, why it must not be used on this CPU (None: it may), e.g. a build with no vector
    path where the default path's own is faster."""

    def __init__(self, source: str, env_var: str, fallback: str, extra_cflags: tuple[str, ...] = (),
                 refuses: Callable[[Any], str | None] = lambda module: None) -> None:
        self.source, self.env_var, self.fallback, self.extra_cflags = source, env_var, fallback, extra_cflags
        self.refuses = refuses
        self.on: bool | None = None

    def module(self):
        """The compiled module; raises KernelUnavailableError when it cannot be built."""
        return load_cpu_extension(self.source, self.extra_cflags)

    def enabled(self) -> bool:
        if self.on is None:
            with _lock_enabled:
                if self.on is None:
                    if not envs.lookup(self.env_var).get():
                        self.on = False
                    else:
                        try:
                            why = self.refuses(self.module())
                        except KernelUnavailableError as exc:
                            why = str(exc)
                        if why is not None:
                            logger.warning("%s: %s", self.fallback, why)
                        self.on = why is None
        return self.on


def build_all() -> list[str]:
    """Build (or find cached) every CPU extension; the failures, as messages."""
    from kernels import cpu_attention, cpu_fused, cpu_linear, cpu_mkl

    failed = []
    for build in (cpu_attention.extension, cpu_fused.extension, cpu_linear.extension, cpu_mkl.extension):
        try:
            build()
        except KernelUnavailableError as exc:
            failed.append(str(exc))
    return failed


if __name__ == "__main__":  # `python -m kernels.cpu_build` (make install runs it once)
    problems = build_all()
    for p in problems:
        print(f"kvscope: {p}", file=sys.stderr)
    print("kvscope: CPU kernels " + ("NOT built; the torch paths will run" if problems else "built"))

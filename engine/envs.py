"""Every environment switch kvscope reads, in one registry (as vLLM keeps ``vllm/envs.py``).

Each ``Switch`` names its variable, its type, its default, what it means and which files
read it. Readers ask the switch (``envs.NUM_THREADS.get()``), which reads ``os.environ``
at that moment: nothing is cached here, so a test's ``monkeypatch.setenv`` is seen at once.
Importing this module changes nothing; the one writer of a default is an explicit call
(``engine.cpu_threads.set_default_wait_policy``, made by the ``kvscope`` command, by
``LLM()`` and by ``bench``).

Three kinds of switch: kvscope's own (``KVSCOPE_*``), the ones only the test suite reads,
and foreign ones (OpenMP's, Triton's, the compiler's, ...) that kvscope reads or sets on
purpose. ``python -m engine.envs --markdown`` prints the README's table;
``kvscope serve --help`` ends with the list (``help_epilog``); tests/test_envs.py fails on a
``KVSCOPE_`` name in the source tree that is not registered here.

This module imports nothing from kvscope (the kernels read it too).
"""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

OWN, TESTS, FOREIGN = "kvscope", "tests", "foreign"


@dataclass(frozen=True)
class Switch:
    """One environment variable. ``kind``:

    - ``on``: a flag, on unless the value is ``0``; ``off``: a flag, on only when ``1``;
    - ``set``: a flag, on when the variable exists at all (whatever its value);
    - ``text``: a string, an empty value counts as unset; ``args``: shell words (shlex);
    - ``int``: a positive integer (a bad value raises ValueError naming the variable);
      ``float``: a number (a bad value falls back to the default).
    """

    name: str
    kind: str
    default: Any
    meaning: str
    readers: tuple[str, ...]
    scope: str = OWN

    def __post_init__(self) -> None:
        if self.kind not in ("on", "off", "set", "text", "args", "int", "float"):
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def is_set(self) -> bool:
        return self.name in os.environ

    def get(self) -> Any:
        """The value now, parsed by ``kind``; the default when unset (or empty)."""
        value = os.environ.get(self.name)
        if self.kind == "on":
            return value != "0"
        if self.kind == "off":
            return value == "1"
        if self.kind == "set":
            return value is not None
        if self.kind == "args":
            if value is not None:
                return tuple(shlex.split(value))
            return None if self.default is None else tuple(self.default)
        if not value:
            return self.default
        if self.kind == "int":
            try:
                n = int(value)
            except ValueError:
                n = 0
            if n < 1:
                raise ValueError(f"{self.name} must be a positive integer, got {value!r}")
            return n
        if self.kind == "float":
            try:
                return float(value)
            except ValueError:
                return self.default
        return value

    def set(self, value: str) -> None:
        """Write the variable (for the child processes and libraries that read it)."""
        os.environ[self.name] = value

    def set_default(self, value: str) -> None:
        """Write the variable unless it is already set (an operator's value wins)."""
        os.environ.setdefault(self.name, value)


_REGISTRY: dict[str, Switch] = {}


def _switch(name: str, kind: str, default: Any, meaning: str, *readers: str, scope: str = OWN) -> Switch:
    s = Switch(name, kind, default, meaning, readers, scope)
    if name in _REGISTRY:
        raise ValueError(f"{name} registered twice")
    _REGISTRY[name] = s
    return s


# ---- kvscope's own ---------------------------------------------------------------------

NUM_THREADS = _switch(
    "KVSCOPE_NUM_THREADS", "int", None,
    "torch CPU threads for every engine (after `--num-threads`); fixes the count (no CoreGovernor)",
    "engine/cpu_threads.py")
SERVE_THREADS = _switch(
    "KVSCOPE_SERVE_THREADS", "int", None,
    "`kvscope serve`'s own fixed thread count (at most the usable cores), below "
    "`KVSCOPE_NUM_THREADS` and `OMP_NUM_THREADS`; unset: the governed default, as offline",
    "engine/cpu_threads.py", "engine/server/commands.py")
ADAPT_THREADS = _switch(
    "KVSCOPE_ADAPT_THREADS", "on", True,
    "`0` keeps the default thread count fixed (no CoreGovernor fitting it to free cores)",
    "engine/cpu_threads.py", "bench/suite.py")
DB = _switch(
    "KVSCOPE_DB", "text", "data/runs.sqlite",
    "the runs database (SQLite file or `file:` URI) of serve, attach, runs, replay, lessons, the dashboard",
    "engine/store/db.py")
CACHE = _switch(
    "KVSCOPE_CACHE", "text", "~/.cache/kvscope",
    "where the dequantized GGUF weights are cached (`gguf/` below it)",
    "engine/model/gguf_cache.py")
TOKEN = _switch(
    "KVSCOPE_TOKEN", "text", None,
    "the server's token (serve, attach), which clients (submit, the dashboard, OpenAI API "
    "callers) must present; required with `--allow-remote`",
    "engine/server/commands.py", "engine/attach/commands.py", "engine/client/commands.py",
    "dashboard/connection.py", "dashboard/views/submit.py")
PACKED_LINEAR = _switch(
    "KVSCOPE_PACKED_LINEAR", "on", True,
    "`0`: CPU linears use `F.linear`, not a weight packed once for MKL / oneDNN",
    "engine/model/layers.py")
CPU_DECODE_KERNEL = _switch(
    "KVSCOPE_CPU_DECODE_KERNEL", "on", True,
    "`0`: CPU decode attention on torch (gather + SDPA), not the C++ paged kernel",
    "kernels/cpu_attention.py")
CPU_FUSED = _switch(
    "KVSCOPE_CPU_FUSED", "on", True,
    "`0`: CPU layers on torch's elementwise ops, not the fused C++ ones",
    "kernels/cpu_fused.py")
CPU_F32_LINEAR = _switch(
    "KVSCOPE_CPU_F32_LINEAR", "on", True,
    "`0`: float32 CPU linears of up to 64 rows on oneDNN's packed weight, not the C++ kernel",
    "kernels/cpu_linear.py")
CPU_MKL_PACKED = _switch(
    "KVSCOPE_CPU_MKL_PACKED", "off", False,
    "`1`: pack CPU linear weights for MKL's packed GEMM (4-64 rows), not oneDNN's (every row count)",
    "kernels/cpu_mkl.py")
CPU_OPENMP = _switch(
    "KVSCOPE_CPU_OPENMP", "on", True,
    "`0`: build the C++ CPU kernels without `-fopenmp` (one thread; another cache name)",
    "kernels/cpu_build.py")
URL = _switch(
    "KVSCOPE_URL", "text", "ws://127.0.0.1:8765",
    "the dashboard's server (websocket URL)", "dashboard/settings.py")
MODEL = _switch(
    "KVSCOPE_MODEL", "text", "smollm2-135m",
    "the model of the server the dashboard starts when nothing answers at `KVSCOPE_URL`",
    "dashboard/settings.py", "dashboard/lessons_page.py")
AUTOSTART = _switch(
    "KVSCOPE_AUTOSTART", "on", True,
    "`0`: the dashboard never starts a server (only connects)", "dashboard/settings.py")
SERVE_ARGS = _switch(
    "KVSCOPE_SERVE_ARGS", "args", (),
    "extra `kvscope serve` arguments for the server the dashboard starts", "dashboard/settings.py")
REFRESH_S = _switch(
    "KVSCOPE_REFRESH_S", "float", 0.5,
    "the dashboard's live refresh period in seconds (at least 0.1)", "dashboard/settings.py")
LESSON_MODEL = _switch(
    "KVSCOPE_LESSON_MODEL", "text", None,
    "the default `--model` of `kvscope lesson` and of the dashboard's lessons page",
    "lessons/commands.py", "dashboard/lessons_page.py")

# ---- read by the test suite only --------------------------------------------------------

FORCE_COMPILED_TRITON = _switch(
    "KVSCOPE_FORCE_COMPILED_TRITON", "off", False,
    "`1`: the tests never set `TRITON_INTERPRET` (GPU runs: compiled kernels)",
    "tests/conftest.py", "bench/gpu_check.sh", scope=TESTS)
VLLM_STARTUP_S = _switch(
    "KVSCOPE_VLLM_STARTUP_S", "float", 480.0,
    "seconds the vLLM tier waits for `vllm serve`'s /health", "bench/vllm_servers.py", scope=TESTS)
UPDATE_SCREENSHOTS = _switch(
    "KVSCOPE_UPDATE_SCREENSHOTS", "off", False,
    "`1`: the browser tests rewrite the docs' screenshots", "tests/dashboard/test_browser.py", scope=TESTS)
BROWSER_MODEL = _switch(
    "KVSCOPE_BROWSER_MODEL", "text", None,
    "the browser tests' model (default: the tiny test model)", "tests/dashboard/test_browser.py",
    scope=TESTS)
BROWSER_SERVE_ARGS = _switch(
    "KVSCOPE_BROWSER_SERVE_ARGS", "args", None,
    "the browser tests' `kvscope serve` arguments (default: the test's own)",
    "tests/dashboard/test_browser.py", scope=TESTS)

# ---- foreign: other software's variables that kvscope reads or sets on purpose ----------

OMP_NUM_THREADS = _switch(
    "OMP_NUM_THREADS", "int", None,
    "exported: torch's thread count; kvscope then sets none and governs none",
    "engine/cpu_threads.py", scope=FOREIGN)
OMP_WAIT_POLICY = _switch(
    "OMP_WAIT_POLICY", "text", None,
    "exported: libgomp's wait policy, and kvscope sets no `GOMP_SPINCOUNT`",
    "engine/cpu_threads.py", "bench/suite.py", scope=FOREIGN)
GOMP_SPINCOUNT = _switch(
    "GOMP_SPINCOUNT", "text", "10000",
    "libgomp's spin before a waiting thread sleeps; kvscope's commands set 10000 (~0.1 ms) "
    "before torch loads unless a wait setting is exported",
    "engine/cpu_threads.py", "bench/suite.py", scope=FOREIGN)
TRITON_INTERPRET = _switch(
    "TRITON_INTERPRET", "off", False,
    "`1`: Triton kernels run in its interpreter (the triton backend on a CPU sets it)",
    "engine/model/attention.py", "kernels/triton_checks.py", "bench/kernels_bench.py",
    "tests/conftest.py", scope=FOREIGN)
PYTHONHASHSEED = _switch(
    "PYTHONHASHSEED", "text", None,
    "vLLM's root of the block-hash chain when set (unset: vLLM's fixed seed), as vLLM reads it",
    "engine/core/hashing.py", scope=FOREIGN)
CXX = _switch(
    "CXX", "text", "c++",
    "the C++ compiler torch's extension builder runs for kernels/*.cpp", "kernels/cpu_build.py",
    scope=FOREIGN)
TORCH_EXTENSIONS_DIR = _switch(
    "TORCH_EXTENSIONS_DIR", "text", None,
    "where torch builds and caches kernels/*.cpp (unset: inside the virtualenv, kvscope-kernels/; "
    "outside one, torch's ~/.cache/torch_extensions)", "kernels/cpu_build.py", scope=FOREIGN)
ONEDNN_PRIMITIVE_CACHE_CAPACITY = _switch(
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "int", 128,
    "oneDNN's cache of compiled primitives; the serving engine defaults it to 128",
    "engine/engine_core/memory_hygiene.py", scope=FOREIGN)
LRU_CACHE_CAPACITY = _switch(
    "LRU_CACHE_CAPACITY", "int", 128,
    "ideep's cache of computations; the serving engine defaults it to 128",
    "engine/engine_core/memory_hygiene.py", scope=FOREIGN)
NO_COLOR = _switch(
    "NO_COLOR", "set", False, "set: lessons print no ANSI bold", "lessons/terminal.py", scope=FOREIGN)
TERM = _switch(
    "TERM", "text", None, "`dumb`: lessons print no ANSI bold", "lessons/terminal.py", scope=FOREIGN)


def switches(scope: str | None = None) -> list[Switch]:
    """Every registered switch (of one scope), in registration order."""
    return [s for s in _REGISTRY.values() if scope is None or s.scope == scope]


def lookup(name: str) -> Switch:
    return _REGISTRY[name]


def _default_text(s: Switch) -> str:
    if s.kind in ("on", "off", "set"):
        return "on" if s.default else "off"
    if s.default is None or s.default == ():
        return "unset"
    return str(s.default)


_KIND_TEXT = {"on": "flag (0 = off)", "off": "flag (1 = on)", "set": "flag (set = on)",
              "text": "text", "args": "shell words", "int": "positive int", "float": "number"}


def markdown_table() -> str:
    """The README's table of switches (tests/test_envs.py keeps the two equal)."""
    rows = ["| variable | type | default | meaning | read by |", "| --- | --- | --- | --- | --- |"]
    for scope in (OWN, TESTS, FOREIGN):
        for s in switches(scope):
            name = s.name if scope == OWN else f"{s.name} ({scope})"
            readers = ", ".join(f"`{r}`" for r in s.readers)
            rows.append(f"| `{name}` | {_KIND_TEXT[s.kind]} | {_default_text(s)} | {s.meaning} | {readers} |")
    return "\n".join(rows) + "\n"


def help_epilog(width: int = 88) -> str:
    """The environment section of ``kvscope serve --help`` (kvscope's and foreign
    switches; the tests' own are left out)."""
    lines = ["environment (engine/envs.py; the README's \"Environment switches\"):"]
    for s in switches(OWN) + switches(FOREIGN):
        lines.append(f"  {s.name} (default: {_default_text(s)})")
        lines += textwrap.wrap(s.meaning.replace("`", ""), width, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m engine.envs --markdown")
    sys.stdout.write(markdown_table())

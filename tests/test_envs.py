"""The registry of environment switches (engine/envs.py): it names every ``KVSCOPE_``
variable in the source tree, every reader asks it, the README's table is its output, and
importing ``engine`` leaves the environment alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import envs

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("engine", "kernels", "dashboard", "lessons", "bench", "tests", "docs", ".ci")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ""}
NAME = re.compile(r"\bKVSCOPE_[A-Z0-9_]*[A-Z0-9]")
# Direct reads of os.environ outside the registry, each with its reason. Everything
# else asks a switch.
DIRECT_ENV = {
    "bench/llama_cpp_compare.py": "builds each llama.cpp child's environment (its OpenMP wait "
                                  "policy per run)",
    "bench/checkout_ab.py": "builds each child's environment (PYTHONPATH and kernel directory per checkout)",
    "bench/threads_ab.py": "builds each child's whole environment",
    "bench/vllm_servers.py": "builds the environments of the vllm serve and kvscope serve it "
                             "starts; reads VLLM_VENV, setup_vllm.sh's variable",
    "dashboard/server_process.py": "copies the environment for the server it starts",
    "engine/engine_core/client.py": "copies the environment for the core's process it starts",
    "engine/simulate/prompt_feed.py": "copies the environment for its child, the engine package on PYTHONPATH",
    "engine/openai/snippets.py": "the text of a client snippet, not a read",
    "kernels/cpu_build.py": "puts the venv's ninja on PATH for torch's builder",
}


def _source_files():
    for d in SOURCE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts:
                yield p
    for name in ("README.md", "Makefile", "pyproject.toml"):
        yield ROOT / name


def test_every_kvscope_name_in_the_tree_is_registered():
    registered = {s.name for s in envs.switches()}
    found: dict[str, str] = {}
    for p in _source_files():
        for name in NAME.findall(p.read_text(errors="replace")):
            found.setdefault(name, str(p.relative_to(ROOT)))
    assert found, "the grep found nothing: the tree moved?"
    unregistered = {n: where for n, where in found.items() if n not in registered}
    assert unregistered == {}, f"register these in engine/envs.py: {unregistered}"
    unused = registered - set(found) - {s.name for s in envs.switches(envs.FOREIGN)}
    assert unused == set(), f"registered but named nowhere: {unused}"


def test_the_named_readers_read_the_switch():
    attr = {s.name: a for a, s in vars(envs).items() if isinstance(s, envs.Switch)}
    for s in envs.switches():
        assert s.readers, s.name
        for reader in s.readers:
            text = (ROOT / reader).read_text()
            assert s.name in text or f"envs.{attr[s.name]}" in text, (s.name, reader)


def test_no_reader_goes_around_the_registry():
    pattern = re.compile(r"os\.environ|getenv\(")
    offenders = []
    for d in ("engine", "kernels", "dashboard", "lessons", "bench"):
        for p in sorted((ROOT / d).rglob("*.py")):
            rel = str(p.relative_to(ROOT))
            if rel != "engine/envs.py" and rel not in DIRECT_ENV and pattern.search(p.read_text()):
                offenders.append(rel)
    assert offenders == [], "read these through engine.envs (or list why not in DIRECT_ENV)"
    for rel in DIRECT_ENV:
        assert pattern.search((ROOT / rel).read_text()), f"{rel} no longer needs its exception"


def test_switches_read_the_environment_at_each_call(monkeypatch):
    monkeypatch.delenv("KVSCOPE_NUM_THREADS", raising=False)
    assert envs.NUM_THREADS.get() is None
    monkeypatch.setenv("KVSCOPE_NUM_THREADS", "3")
    assert envs.NUM_THREADS.get() == 3
    monkeypatch.setenv("KVSCOPE_NUM_THREADS", "0")
    with pytest.raises(ValueError, match="KVSCOPE_NUM_THREADS"):
        envs.NUM_THREADS.get()
    monkeypatch.setenv("KVSCOPE_AUTOSTART", "0")
    assert envs.AUTOSTART.get() is False
    monkeypatch.setenv("KVSCOPE_AUTOSTART", "no")  # only 0 turns an on-flag off
    assert envs.AUTOSTART.get() is True
    monkeypatch.setenv("KVSCOPE_REFRESH_S", "fast")
    assert envs.REFRESH_S.get() == 0.5
    monkeypatch.setenv("KVSCOPE_SERVE_ARGS", "--port 1 --label 'a b'")
    assert envs.SERVE_ARGS.get() == ("--port", "1", "--label", "a b")
    monkeypatch.setenv("KVSCOPE_DB", "")
    assert envs.DB.get() == "data/runs.sqlite"  # empty counts as unset


def test_the_readme_table_is_the_registry():
    text = (ROOT / "README.md").read_text()
    begin, end = "<!-- envs table: begin -->\n", "<!-- envs table: end -->"
    table = text[text.index(begin) + len(begin):text.index(end)]
    assert table == envs.markdown_table(), "regenerate it: python -m engine.envs --markdown"
    out = subprocess.run([sys.executable, "-m", "engine.envs", "--markdown"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    assert out == table


def test_serve_help_lists_the_switches():
    from engine.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["serve"].format_help()
    for s in envs.switches(envs.OWN) + envs.switches(envs.FOREIGN):
        assert s.name in text, s.name
    assert "KVSCOPE_UPDATE_SCREENSHOTS" not in text  # the tests' own switches are not the user's


def test_importing_engine_leaves_the_environment_unchanged():
    code = ("import os, json; before = dict(os.environ); import engine, engine.envs, engine.llm, "
            "engine.cpu_threads; print(json.dumps(dict(os.environ) == before))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "true"

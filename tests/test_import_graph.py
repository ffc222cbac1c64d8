"""The package import graph of ``engine`` has no cycle, and its bottom layers stay at
the bottom: ``engine.events`` imports nothing else from ``engine``, ``engine.core``
only ``engine.events``.

Nodes are the subpackages (``engine.core``, ``engine.events``, ``engine.model``,
``engine.server``, ``engine.store``, ...) and the top-level modules (``engine.llm``,
``engine.cli``, ...); an edge is any import between two of them, at module level,
inside a function or under ``TYPE_CHECKING`` alike (read with ``ast``, nothing is
imported). ``__import__("x")`` and ``importlib.import_module("x")`` count as imports of
``x``; one whose module is not a string literal is an import the graph cannot see, and
fails ``test_no_import_hidden_from_the_graph``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "engine"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _node(name: str) -> str | None:
    """The graph node a module belongs to: ``engine`` itself, or ``engine.<first part>``."""
    parts = name.split(".")
    if parts[0] != "engine":
        return None
    return "engine" if len(parts) == 1 else f"engine.{parts[1]}"


def _dynamic_import(n: ast.AST) -> ast.expr | None:
    """The module argument of an ``__import__(...)`` or ``importlib.import_module(...)``
    call, else None."""
    if not isinstance(n, ast.Call) or not n.args:
        return None
    f = n.func
    if (isinstance(f, ast.Name) and f.id in ("__import__", "import_module")) or \
            (isinstance(f, ast.Attribute) and f.attr in ("__import__", "import_module")):
        return n.args[0]
    return None


def hidden_imports(source: str) -> list[int]:
    """Lines of dynamic imports whose module is not a string literal."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if (arg := _dynamic_import(n)) is not None
            and not (isinstance(arg, ast.Constant) and isinstance(arg.value, str))]


def _imported_modules(path: Path, module: str) -> set[str]:
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        arg = _dynamic_import(n)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.add(arg.value)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package.split(".")[: len(package.split(".")) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module
            # ``from engine.core import snapshot`` imports a module (as ``import
            # engine.core.snapshot`` does), ``from engine.core import Scheduler`` a name of the
            # package's own ``__init__``
            for a in n.names:
                out.add(f"{mod}.{a.name}" if _is_module(f"{mod}.{a.name}") else mod)
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        src = _node(module)
        graph.setdefault(src, set())
        for target in _imported_modules(path, module):
            dst = _node(target)
            if dst is not None and dst != src:
                graph[src].add(dst)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_the_sources():
    graph = package_graph()
    assert {"engine.core", "engine.events", "engine.model", "engine.server",
            "engine.store"} <= set(graph)
    assert "engine.events" in graph["engine.core"]  # core imports the event types
    assert "engine.llm_engine" in graph["engine.server"]


def test_no_cycle_between_packages():
    assert cycles(package_graph()) == []


def test_events_and_core_stay_at_the_bottom():
    graph = package_graph()
    assert graph["engine.events"] == set(), graph["engine.events"]
    # the switch registry is a leaf (it imports nothing of kvscope): the core reads vLLM's
    # PYTHONHASHSEED through it, as every reader of the environment does
    assert graph["engine.envs"] == set(), graph["engine.envs"]
    assert graph["engine.core"] == {"engine.events", "engine.envs"}, graph["engine.core"]


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_hidden_from_the_graph():
    hidden = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py"))
              if (lines := hidden_imports(p.read_text()))}
    assert hidden == {}, "import these with an import statement, so the graph sees them"


def test_dynamic_imports_are_edges_or_failures():
    # engine.cli once registered its subcommands through __import__(module) in a loop,
    # which hid an engine.cli <-> engine.server cycle from the graph
    loop = "for module in ('engine.server.commands',):\n    mod = __import__(module)\n"
    assert hidden_imports(loop) == [2]
    assert hidden_imports("import importlib\nimportlib.import_module(name)\n") == [2]
    assert hidden_imports("__import__('engine.server')\n") == []


def test_the_command_line_is_the_top():
    graph = package_graph()
    assert {"engine.server", "engine.store", "engine.attach", "engine.client"} <= graph["engine.cli"]
    assert not any("engine.cli" in deps for deps in graph.values())


def test_each_class_name_is_defined_once_in_engine():
    # two RequestStates (the reducer's and the output processor's) read the same in an
    # import line and a traceback; a name says which concept it is
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for n in ast.parse(path.read_text()).body:
            if isinstance(n, ast.ClassDef):
                where.setdefault(n.name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in where.items() if len(v) > 1} == {}

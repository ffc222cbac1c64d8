"""engine.events and engine.store stay plain Python: no torch, no streamlit; and inside
engine.events the sub-packages keep their order (schema at the bottom, then metrics,
folds, baseline)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "engine" / "events"
# what each sub-package of engine.events may import from the others
MAY_IMPORT = {
    "schema": set(),
    "metrics": {"schema"},
    "folds": {"schema", "metrics"},
    "baseline": {"schema", "metrics", "folds"},
}


def _modules() -> list[str]:
    out = []
    for p in sorted(EVENTS.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_events_and_store_import_neither_torch_nor_streamlit():
    mods = _modules()
    assert "engine.events.schema.types" in mods and "engine.events.folds.reducer" in mods
    code = (f"import sys, {', '.join(mods)}, engine.store, engine.store.commands; "
            "bad = [m for m in ('torch', 'streamlit') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_sub_packages_keep_their_order():
    bad = []
    for pkg, allowed in MAY_IMPORT.items():
        for p in sorted((EVENTS / pkg).rglob("*.py")):
            for n in ast.walk(ast.parse(p.read_text())):
                if isinstance(n, ast.ImportFrom) and n.level == 0:
                    names = [n.module]
                elif isinstance(n, ast.Import):
                    names = [a.name for a in n.names]
                else:
                    continue
                for name in names:
                    if name.startswith("engine.events."):
                        other = name.split(".")[2]
                        if other != pkg and other not in allowed:
                            bad.append(f"{p.relative_to(ROOT)} imports {name}")
    assert bad == []
    assert set(MAY_IMPORT) == {p.name for p in EVENTS.iterdir() if (p / "__init__.py").is_file()}

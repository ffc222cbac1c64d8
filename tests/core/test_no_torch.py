import subprocess
import sys

# Blocks torch (and streamlit, transformers) at import time, runs ``imports``, and prints
# "ok" only if torch never got loaded. Shared by every torch-free package's test.
BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "streamlit", "transformers"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
%s
assert "torch" not in sys.modules
print("ok")
"""


def assert_imports_without_torch(imports: str) -> None:
    """Run ``imports`` (Python statements) in a fresh interpreter with torch blocked."""
    out = subprocess.run([sys.executable, "-c", BLOCK_TORCH % imports], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_core_and_events_import_without_torch():
    assert_imports_without_torch("import engine.core, engine.events.schema.types\n"
                                 "from engine.core import Scheduler")

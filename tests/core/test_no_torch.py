import subprocess
import sys

BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch.") or name in ("streamlit", "transformers"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _NoTorch())
import engine.core, engine.events.types
from engine.core import Scheduler
assert "torch" not in sys.modules
print("ok")
"""


def test_core_and_events_import_without_torch():
    out = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

"""engine.kv_events imports neither torch nor transformers: attach mode and other torch-free
readers (the dashboard's side) use its decoder, and a publisher needs only the core's events."""

import subprocess
import sys

BLOCK = """
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "streamlit", "transformers"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Blocked())
import engine.config
import engine.kv_events.decoder, engine.kv_events.publisher, engine.kv_events.replay
assert "torch" not in sys.modules
print("ok")
"""


def test_kv_events_import_without_torch():
    out = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"

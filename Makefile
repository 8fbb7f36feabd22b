# The README's two commands: `make repro` (install + run the pipeline) and `make test` (install + tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned here: 2.13.0 is the CPU build on the reference machine; a bare `torch` pulls CUDA.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install repro test clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

repro: install
	$(BIN)/python -m stages.config check
	$(BIN)/dvc repro

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)

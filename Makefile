# The README's two commands: `make repro` (install + run the pipeline) and `make test` (install + tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned here: 2.13.0 is the CPU build on the reference machine; a bare `torch` pulls CUDA.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install browser repro test clean-venv

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

# The report test opens the HTML in headless Chromium (Debian's `chromium`); installed when missing
# and we may (root or passwordless sudo); otherwise that one test is skipped with the reason.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null \
	      || echo "note: could not install chromium; the headless-browser test will be skipped"; \
	  else echo "note: chromium not found and cannot be installed here; the headless-browser test will be skipped"; fi; }

test: install browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)

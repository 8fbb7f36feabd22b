# The README's two commands: `make repro` (install + run the pipeline) and `make test` (install + tests).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Every package comes from a lock (locks/*.txt: exact versions and sha256 hashes, made by `make lock`).
# TORCH picks the build of torch and so the lock: cpu (torch 2.13.0+cpu, from PyTorch's CPU wheel index)
# or cuda (PyPI's torch 2.13.0 with its CUDA wheels, for Linux x86-64 and Python 3.12).
TORCH  ?= cpu
LOCK   := locks/$(TORCH).txt
# The test harness (pytest, playwright, moto), locked as a layer over LOCK at its versions: `make test` adds it to
# .venv; `make repro` never installs it, and provenance names LOCK alone.
TEST_LOCK := locks/$(TORCH)-test.txt
# Ray (`mless repro --cluster`: docs/gpu.md, "Every GPU of a node or a cluster"), a layer of its own over LOCK:
# `make install-cluster` adds it, `make test` adds it beneath the test harness, `make repro` never installs it.
CLUSTER_LOCK := locks/$(TORCH)-cluster.txt
export PATH := $(abspath $(BIN)):$(PATH)
export DVC_NO_ANALYTICS := 1
# Bytecode cached as Python does by default, even where the caller's environment turns it off: uv installs without
# compiling, so a process that may not write __pycache__ compiles every module it imports again (about 1 s of each
# `dvc` command: docs/benchmarks.md). The project's own __pycache__ folders are ignored by git and by DVC
# (.dvcignore), so they never change a code dependency.
unexport PYTHONDONTWRITEBYTECODE
# pip's notice that a newer pip exists is no news to a newcomer: the venv's own pip installs the locks.
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install install-test install-cluster install-vllm uv lock check-torch system-packages repro cluster-repro verify test test-fast faults test-vllm test-gpu gpu-check gpu-wheels clean-venv

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-cluster: $(VENV)/.installed-cluster

check-torch:
	@case "$(TORCH)" in cpu|cuda) ;; *) echo "error: TORCH=$(TORCH): expected cpu or cuda (the lock locks/<TORCH>.txt)" >&2; exit 2;; esac

# uv installs the environments (seconds where pip takes minutes: docs/benchmarks.md) and makes the locks. It comes
# from locks/uv.txt (one version, every platform's hashes) into a venv of its own, by pip, which reads this
# machine's configuration; uv reads neither pip.conf nor PIP_* variables, so `envlock install` hands pip's index
# and find-links settings over to it.
UV_VENV ?= .venv-uv
UV      := $(UV_VENV)/bin/uv
uv: $(UV)
$(UV): locks/uv.txt
	rm -rf $(UV_VENV)
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet --require-hashes --no-deps -r locks/uv.txt
	touch $@

# A new environment holding exactly the lock: uv with --require-hashes --no-deps fails loudly on any package the
# lock lacks or whose file differs, and runs no resolver; torch's CPU build comes from PyTorch's CPU index, or from
# a wheel folder of pip's configuration that holds the locked file (meaningless_tokens/envlock/install.py). The
# project itself goes in without build isolation (setuptools is locked too), then `envlock record` notes the lock
# for provenance and `envlock check` compares.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
envlock_install = $(PYTHON) -m meaningless_tokens.envlock install --uv $(UV) --python $(1)/bin/python --torch-index $(TORCH_INDEX) $(2)
$(VENV)/.installed: pyproject.toml Makefile $(LOCK) $(UV) | check-torch
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(call envlock_install,$(VENV),$(LOCK))
	$(UV) pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	$(BIN)/python -m meaningless_tokens.envlock record $(LOCK)
	$(BIN)/python -m meaningless_tokens.envlock check
	touch $@

$(VENV)/.installed-cluster: $(VENV)/.installed $(CLUSTER_LOCK)
	$(call envlock_install,$(VENV),$(CLUSTER_LOCK))
	$(BIN)/python -m pip check
	$(BIN)/python -m meaningless_tokens.envlock record $(LOCK) $(CLUSTER_LOCK)
	$(BIN)/python -m meaningless_tokens.envlock check
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-cluster $(TEST_LOCK)
	$(call envlock_install,$(VENV),$(TEST_LOCK))
	$(BIN)/python -m pip check
	$(BIN)/python -m meaningless_tokens.envlock record $(LOCK) $(CLUSTER_LOCK) $(TEST_LOCK)
	$(BIN)/python -m meaningless_tokens.envlock check
	touch $@

# Remake every lock from pyproject.toml and locks/*.in with uv, then reinstall from it. Results then follow the
# environment: `dvc repro` and commit dvc.lock with the locks.
lock: $(UV)
	$(PYTHON) -m meaningless_tokens.envlock lock --uv $(UV)

# The vLLM engine (evaluate.engine: vllm) in an environment of its own, from its own lock: vLLM pins
# transformers, so this one gets an older release than the default install. TORCH=cuda on a GPU machine
# (vllm and CUDA torch); the CPU variant's torchvision/torchaudio/torchcodec are left out of its lock
# (built for another torch, they break `import transformers`' image paths; vLLM's text models do not use them).
VLLM_VENV  ?= .venv-vllm
VLLM_LOCK  := locks/vllm-$(TORCH).txt
install-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml Makefile $(VLLM_LOCK) $(UV) | check-torch
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(call envlock_install,$(VLLM_VENV),$(VLLM_LOCK))
	$(UV) pip install --quiet --python $(VLLM_VENV)/bin/python --no-deps --no-build-isolation -e .
	$(VLLM_VENV)/bin/python -m meaningless_tokens.envlock record $(VLLM_LOCK)
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

repro: install
	$(BIN)/python -m meaningless_tokens.config check
	$(BIN)/dvc repro

# The pipeline's stages as Ray tasks, as many at once as the CPUs and GPUs allow, each in a workspace of its own;
# then `dvc repro` here restores every stage from the run-cache (docs/gpu.md). CLUSTER=<address> joins a running
# Ray cluster (else a local one is started); CLUSTER_ARGS: more options of `mless repro`.
cluster-repro: install-cluster
	$(BIN)/python -m meaningless_tokens.config check
	$(BIN)/mless repro --cluster $(CLUSTER) $(CLUSTER_ARGS)

# Whether the workspace's outputs reproduce those of REV (a git revision or `dvc exp` name): every output of
# dvc.lock compared by value within the tolerances of docs/sharing.md, one row each and a verdict line.
REV ?= HEAD
verify: install
	$(BIN)/python -m meaningless_tokens.verify $(REV)

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

# Two workers, work spread by test: a module whose fixture builds something of its own for minutes (the sharing
# project, the GPU dry run, the report's project) is one xdist group and so one worker's, the rest go test by test
# to whichever worker is free; the tiny pipeline is built once for both (tests/shared.py), and each worker's torch
# runs one thread (tests/conftest.py). `make test PYTEST_WORKERS=` runs everything in one process.
PYTEST_WORKERS ?= -n 2 --dist loadgroup

test: install-test system-packages
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The loop of work (docs/development.md): every test not marked slow (the report's and add-model's own tests among
# them), and the slow ones that check a README promise end to end (marker `readme`: one `dvc repro`, a param change
# rerunning only its stages, `make verify`); `make test` runs them all.
test-fast: install-test system-packages
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow or readme" $(PYTEST_ARGS)

# The fault-injection cases alone (docs/faults.md; `make test` runs them too); FAULT_SEED=<n> replays a kill
# sequence, FAULT_KILLS=<n> sets how many kills.
faults: install-test
	$(BIN)/python -m pytest $(PYTEST_ARGS) tests/test_faults.py tests/test_bad_input.py

# The tests of the vLLM engine (tests/test_vllm.py) in the vLLM environment; `make test` skips them.
test-vllm: install-vllm
	PATH=$(abspath $(VLLM_VENV))/bin:$$PATH $(VLLM_VENV)/bin/python -m pytest $(PYTEST_ARGS) tests/test_vllm.py

# The CUDA tier (tests/test_cuda.py, marker `cuda`) on a GPU machine whose python3 already holds CUDA torch:
# nothing is installed from the locks there (such a machine may have no network). The packages its image
# lacks or holds too old travel as wheels in .whl/ (made here by `make gpu-wheels`, at the versions of
# locks/cuda.txt, for CPython 3.11-3.13 on x86-64 and aarch64: pip there picks the file that fits its python);
# no DVC: the tier runs the stages in-process. The preflight (benchmarks/gpu_preflight.py) names, one line each,
# any module the check imports that is still missing or too old, and the wheel that would bring it.
GPU_PYTHON ?= python3
GPU_SITE   ?= /tmp/meaningless-tokens-gpu-site
# The image's own package names (and the versions read from it) are in locks/gpu-image.txt: `make gpu-wheels`
# fails naming any requirement of a carried wheel that neither another carried wheel nor the image provides.
GPU_WHEELS := transformers tokenizers huggingface-hub safetensors httpx2 httpcore2 truststore pydantic pydantic-core \
              annotated-types typing-inspection math-verify latex2sympy2-extended antlr4-python3-runtime ruamel-yaml
GPU_IMAGE  := locks/gpu-image.txt
# The carried packages, by name at the lock's versions, from .whl alone (pip chooses the file that fits this python),
# into $(GPU_SITE); pip check with that folder on the path (printed, not fatal: the image's own packages may conflict
# among themselves); then the preflight.
define gpu_site
	if ls .whl/*.whl >/dev/null 2>&1; then \
	  pins=$$(for n in $(GPU_WHEELS); do grep -iE "^$$n==" locks/cuda.txt | cut -d' ' -f1; done); \
	  $(GPU_PYTHON) -m pip install -q --no-index --find-links .whl --only-binary=:all: --no-deps --no-compile --upgrade \
	    --target $(GPU_SITE) $$pins || exit 1; fi
	@echo "pip check with $(GPU_SITE) on the path (version conflicts between the wheels and the image):"
	-PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) -m pip check
endef

test-gpu:
	$(gpu_site)
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) benchmarks/gpu_preflight.py
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) -m pytest -p no:cacheprovider -m cuda tests/test_cuda.py $(PYTEST_ARGS)

# One command for whoever is lent a GPU (docs/gpu.md, "make gpu-check"): the preflight, the CUDA tier, then every
# model stage on random-weight models with the real configs of Qwen2.5-Math-1.5B and -7B (ALL=1: Llama-3.1-8B-Instruct
# and Gemma-3-4b-it too), timed, each part within its time limit (9 minutes in all, the install included: one command
# of a GPU slot); gpu-check.json, gpu-check.md and tier.log in GPU_CHECK_OUT, written as each row finishes. Installs the
# wheels as test-gpu does. TINY=1: tiny widths on the CPU in this project's venv with the test harness (the tier is
# pytest, which the preflight asks for); GPU_CHECK_ARGS: more options of benchmarks/gpu_check.py.
GPU_CHECK_OUT ?= /tmp/gpu-check$(if $(TINY),-tiny)
gpu-check: $(if $(TINY),install-test)
ifdef TINY
	$(BIN)/python benchmarks/gpu_check.py --tiny --out $(GPU_CHECK_OUT) $(if $(ALL),--all-models) $(GPU_CHECK_ARGS)
else
	$(gpu_site)
	PYTHONPATH=$(GPU_SITE):$(CURDIR) $(GPU_PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(if $(ALL),--all-models) $(GPU_CHECK_ARGS)
endif

# Every wheel of GPU_WHEELS at locks/cuda.txt's versions for each (CPython, machine) of envlock's TARGETS, then the
# closure check per target (aarch64 best effort: a package without a wheel there is named). A package with no wheel
# on the index is built here only if it is pure Python.
gpu-wheels:
	$(PYTHON) -m meaningless_tokens.envlock gpu-wheels .whl $(GPU_IMAGE) locks/cuda.txt $(GPU_WHEELS)
	du -sh .whl

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV) $(UV_VENV)

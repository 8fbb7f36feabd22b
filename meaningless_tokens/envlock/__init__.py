"""The locked environment: `make lock` writes locks/*.txt, `make install` installs exactly one of them.

A lock is a pip requirements file in which every package, transitive ones included, has an exact
version and the sha256 of each of its distributions (made by uv's `pip compile --generate-hashes`;
installed by plain pip with `--require-hashes --no-deps`, so a lock that lacks a package fails the
install instead of pulling whatever the index serves that day). Its first line records the digest of
what it was made from (pyproject.toml's requirement tables and locks/*.in), so a lock older than
pyproject.toml is told apart from one that merely satisfies it.

    python -m meaningless_tokens.envlock lock [NAME ...]   # remake the locks (needs uv: `make uv` provides it)
    python -m meaningless_tokens.envlock install --uv UV --python PY LOCK  # one lock into an environment, from its sources
    python -m meaningless_tokens.envlock record LOCK [LAYER]  # after an install: which lock(s) this environment holds
    python -m meaningless_tokens.envlock check             # the environment against its lock; pyproject against every lock
    python -m meaningless_tokens.envlock wheels DIR IMAGE [NAME ...]  # the GPU machine's wheels form a closed set, per target
    python -m meaningless_tokens.envlock gpu-wheels DIR IMAGE LOCK NAME ...  # fetch them for every target, then `wheels`
"""

# The package: the lock itself (lock), installing one with uv (install), making the locks (compile), the GPU
# machine's wheels (gpu) and the command line (cli; __main__ runs it). Standard library only at the top of each.
from meaningless_tokens.envlock.cli import main
from meaningless_tokens.envlock.compile import CPU_TORCH_WHEELS, make
from meaningless_tokens.envlock.gpu import (GPU_MARKERS, TARGETS, closure, fetch, fits, image_names, image_versions,
                                            markers, wheel_closure, wheel_requirements)
from meaningless_tokens.envlock.install import (CPU_TORCH_INDEX, Sources, blocks, install, local_wheel_folder,
                                                pip_sources)
from meaningless_tokens.envlock.lock import (HEADER, LOCK_DIR, ROOT, SPECS, UNLOCKED, LockSpec, canonical, drift,
                                             input_digest, installed, parse, pyproject_disagreements, record,
                                             recorded_digest, recorded_layers, recorded_locks)
from meaningless_tokens.errors import LockError

__all__ = ["CPU_TORCH_INDEX", "CPU_TORCH_WHEELS", "GPU_MARKERS", "HEADER", "LOCK_DIR", "ROOT", "SPECS", "UNLOCKED",
           "LockError", "LockSpec", "Sources", "TARGETS", "blocks", "canonical", "closure", "drift", "fetch", "fits",
           "image_names", "image_versions", "markers",
           "input_digest", "install", "installed", "local_wheel_folder", "main", "make", "parse", "pip_sources",
           "pyproject_disagreements", "record", "recorded_digest", "recorded_layers", "recorded_locks",
           "wheel_closure", "wheel_requirements"]

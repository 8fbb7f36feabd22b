"""Compiling the locks (`make lock`): uv's `pip compile` for each lock, headed by its inputs' digest and the
command that made it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from meaningless_tokens.envlock.install import CPU_TORCH_INDEX
from meaningless_tokens.envlock.lock import HEADER, LOCK_DIR, ROOT, SPECS, input_digest, parse

# Where the CPU build of torch is found when locking: the reference machine's wheel folder (its pip.conf names it
# too), else PyTorch's CPU wheel page; MLESS_TORCH_WHEELS overrides both.
CPU_TORCH_WHEELS = os.environ.get("MLESS_TORCH_WHEELS") or (
    "/opt/wheels" if Path("/opt/wheels").is_dir() else f"{CPU_TORCH_INDEX}/torch/")


def make(names: list[str], uv: str) -> None:
    digest = input_digest()
    for name in names:
        if name == "uv":
            cmd = [uv, "pip", "compile", "locks/uv.in", "--universal", "--generate-hashes", "--no-header", "--quiet",
                   "-o", "locks/uv.txt"]
            _compile(cmd, " ".join(cmd[1:]), LOCK_DIR / "uv.txt", digest, uv)
            continue
        spec = SPECS[name]
        sources = ["pyproject.toml", "locks/build.in"]
        cmd = [uv, "pip", "compile", *sources, *[a for e in spec.extras for a in ("--extra", e)],
               "--override", f"locks/torch-{spec.torch}.in", "--generate-hashes", "--no-header", "--quiet",
               *spec.platform_args, *[a for p in spec.omit for a in ("--no-emit-package", p)],
               "-o", str(spec.path.relative_to(ROOT))]
        if spec.torch == "cpu":  # the reference machine's CPU wheel of torch (its pip.conf names the folder too)
            cmd += ["--find-links", CPU_TORCH_WHEELS]
        shown = " ".join(cmd[1:])
        for below in spec.base:  # the versions of the locks below for what both hold; only what the layer adds is written
            base = SPECS[below].path.relative_to(ROOT)
            held = sorted(parse(ROOT / base))
            cmd += ["--constraint", str(base), *[a for n in held for a in ("--no-emit-package", n)]]
            shown += f" --constraint {base} --no-emit-package <each of the {len(held)} packages of {base}>"
        _compile(cmd, shown, spec.path, digest, uv)


def _compile(cmd: list[str], shown: str, path: Path, digest: str, uv: str) -> None:
    """Run uv's compile (it prefers the versions of the lock it rewrites, so a refresh moves only what must move)
    and head the lock with its inputs' digest and the command."""
    print(f"{path.relative_to(ROOT)}: {shown}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    body = path.read_text()
    # The header names the module as the locks always have (meaningless_tokens/envlock.py, now this package), so a
    # remade lock differs from the one it replaces only where uv's resolution moved.
    path.write_text(f"{HEADER}{digest}\n# made by `make lock` (meaningless_tokens/envlock.py, {Path(uv).name} "
                    f"{_uv_version(uv)}): {shown}\n{body}")


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]

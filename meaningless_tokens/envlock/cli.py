"""The command line, `python -m meaningless_tokens.envlock COMMAND`: lock, install, record, check, wheels."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from meaningless_tokens.envlock.compile import make
from meaningless_tokens.envlock.gpu import REQUIRED_MACHINES, TARGETS, fetch, fits, wheel_closure
from meaningless_tokens.envlock.install import CPU_TORCH_INDEX, install
from meaningless_tokens.envlock.lock import (ROOT, SPECS, drift, pyproject_disagreements, record, recorded_layers,
                                             recorded_locks)
from meaningless_tokens.errors import LockError


def main(argv: list[str] | None = None) -> int:
    from meaningless_tokens import envlock  # its docstring: the commands

    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.envlock", description=envlock.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lock", help="remake locks/<name>.txt (all by default)")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(SPECS)}")
    p.add_argument("--uv", default=shutil.which("uv") or "uv")
    p = sub.add_parser("install", help="install exactly one lock into an environment with uv")
    p.add_argument("lock", type=Path)
    p.add_argument("--uv", required=True, help="the uv binary (`make uv`)")
    p.add_argument("--python", required=True, help="the environment's interpreter")
    p.add_argument("--torch-index", default=CPU_TORCH_INDEX,
                   help=f"where a pin with a local version (torch's +cpu) comes from (default {CPU_TORCH_INDEX})")
    p = sub.add_parser("record", help="note which lock this environment was installed from")
    p.add_argument("lock", type=Path)
    p.add_argument("layers", type=Path, nargs="*", help="locks installed over it (locks/<name>-test.txt)")
    sub.add_parser("check", help="the environment against its lock, and pyproject.toml against every lock")
    p = sub.add_parser("wheels", help="the wheels carried to the GPU machine require nothing it lacks")
    p.add_argument("folder", type=Path)
    p.add_argument("image", type=Path, help="the GPU image's package names, one a line")
    p.add_argument("names", nargs="*", metavar="NAME", help="the packages carried (default: every wheel's)")
    p = sub.add_parser("gpu-wheels", help="fetch the carried packages' wheels for every target, then `wheels`")
    p.add_argument("folder", type=Path)
    p.add_argument("image", type=Path, help="the GPU image's package names, one a line")
    p.add_argument("lock", type=Path, help="the lock whose versions are carried (locks/cuda.txt)")
    p.add_argument("names", nargs="+", metavar="NAME")
    args = ap.parse_args(argv)
    try:
        if args.command == "lock":
            unknown = [n for n in args.names if n not in SPECS and n != "uv"]
            if unknown:
                raise LockError(f"no lock named {', '.join(unknown)}; the locks are uv, {', '.join(SPECS)}")
            make(args.names or ["uv", *SPECS], args.uv)
        elif args.command == "install":
            install(args.lock, args.uv, args.python, args.torch_index)
        elif args.command == "record":
            record(args.lock, args.layers)
        elif args.command in ("wheels", "gpu-wheels"):
            if args.command == "gpu-wheels":
                lacking = fetch(args.names, args.lock, args.folder)
                for name, targets in lacking.items():
                    print(f"note: {name}: no wheel for " + ", ".join(f"CPython {py} on {m}" for py, m in targets),
                          file=sys.stderr)
            problems = wheel_closure(args.folder, args.image, args.names or None)
            wheels = sorted(args.folder.glob("*.whl"))
            failed = False
            for target in TARGETS:
                found = problems.get(target, [])
                required = target[1] in REQUIRED_MACHINES
                failed |= bool(found) and required
                n = sum(fits(w.name, *target) for w in wheels)
                print(f"CPython {target[0]} on {target[1]}: " + (
                    f"{n} wheels, every requirement met by them or the image's packages ({args.image})" if not found
                    else f"{'error' if required else 'not carried (best effort)'}: " + "; ".join(found)),
                    file=sys.stderr if found else sys.stdout)
            if failed:
                return 1
        else:
            from meaningless_tokens.store import ENV_RECORD, environment

            env = environment()
            problems = [p for s in SPECS.values() for p in pyproject_disagreements(s)]
            if env["lock"] is None:
                problems.append(f"{sys.prefix}: not installed from a lock (no {ENV_RECORD}): run `make install`")
            else:
                locks = recorded_locks()
                shown = " + ".join(str(lock.relative_to(ROOT)) for lock in locks)
                problems += [f"{shown}: {line}" for line in drift(locks)]
            if problems:
                print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
                return 1
            layers = "".join(f" + {layer}" for layer in recorded_layers())
            print(f"{sys.prefix}: matches {env['lock']} (sha256 {env['sha256'][:12]}…){layers}")
    except (LockError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

"""`python -m meaningless_tokens.config check [FILE]` checks a params file as every stage does; `use <profile>`
copies profiles/<profile>.yaml over params.yaml after checking it."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from meaningless_tokens.config.base import PARAMS_FILE, PROFILES_DIR, ROOT
from meaningless_tokens.config.checks import check_files, check_spelled_out
from meaningless_tokens.config.loading import load_params
from meaningless_tokens.errors import ConfigError


def use_profile(profile: str, target: Path = ROOT / "params.yaml") -> Path:
    src = Path(profile) if profile.endswith((".yaml", ".yml")) else PROFILES_DIR / f"{profile}.yaml"
    if not src.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise ConfigError(f"profile '{profile}' not found ({src}); known profiles: {known}")
    load_params(src)
    tmp = target.with_suffix(".yaml.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, target)
    return src


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.config", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    check = sub.add_parser("check", help="validate a params file (default params.yaml)")
    check.add_argument("path", nargs="?", default=str(PARAMS_FILE))
    use = sub.add_parser("use", help="copy profiles/<name>.yaml over params.yaml after validating it")
    use.add_argument("profile", help="cpu, gpu, or a path to a yaml file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "use":
            src = use_profile(args.profile)
            print(f"params.yaml <- {src.relative_to(ROOT) if src.is_relative_to(ROOT) else src}")
        else:
            path = getattr(args, "path", str(PARAMS_FILE))
            p = load_params(path)
            check_spelled_out(p)  # as every stage's command does, for its own models
            check_files(p)  # as the stages do when they read them, before any work
            print(f"{path}: ok (profile {p.profile}; models {', '.join(p.models)}; evaluated {', '.join(p.evaluated)})")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


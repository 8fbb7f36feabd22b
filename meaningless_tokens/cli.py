"""The command line every stage shares: `python -m stages.<stage> --model NAME [--params FILE]` (prepare: any
number of `--model`, default every model; figures, report, explorer: no `--model`).

Bad input (any StageError) is one `error: ...` line and exit status 2, and so is a filesystem fault (full disk,
read-only or missing folder, permission denied: `error: <path>: <reason>`); Ctrl-C is exit status 130.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable

from pydantic import ValidationError

from meaningless_tokens.config import PARAMS_FILE, Shard, check_spelled_out, load_params
from meaningless_tokens.errors import ConfigError, StageError
from meaningless_tokens.store import os_error_line


def main(stage: str, doc: str | None, run: Callable, argv: list[str] | None = None, per_model: bool = True,
         many: bool = False, shards: str | None = None) -> int:
    """Parse the command line, load the params and call `run(params, model)` (`per_model`; for each model named,
    default all, with `many`) or `run(params)`; every failure one `error:` line. `shards`: the stage's generation
    splits into parts (`--shard I/N`, passed as `run(params, model, shard=Shard)`), this text saying what a part is."""
    ap = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if many:
        ap.add_argument("--model", action="append", help="model name from params.yaml (repeatable; default: all)")
    elif per_model:
        ap.add_argument("--model", required=True, help="model name from params.yaml")
    ap.add_argument("--params", default=str(PARAMS_FILE))
    if shards:
        ap.add_argument("--shard", metavar="I/N", help=f"run shard I (0-based) of N: {shards}")
    args = ap.parse_args(argv)
    try:
        if getattr(args, "shard", None):
            part = parse_shard(args.shard)
            run = functools.partial(run, shard=part)
        params = load_params(args.params)
        # as `config check` does, for the models this command runs: every key dvc.yaml lists is spelled out
        check_spelled_out(params, (args.model or None) if many else [args.model] if per_model else [])
        if many:
            for name in args.model or list(params.models):
                run(params, name)
        else:
            run(params, args.model) if per_model else run(params)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a filesystem fault the stage met outside the writers (meaningless_tokens/store names those)
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0



def parse_shard(text: str) -> Shard:
    """`--shard I/N` (0-based I) as a Shard."""
    try:
        index, count = (int(x) for x in text.split("/"))
        return Shard(index=index, count=count)
    except (ValueError, ValidationError) as e:
        reason = e.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(e, ValidationError) else "expected I/N"
        raise ConfigError(f"--shard {text}: {reason} (index I of count N, 0 <= I < N)") from None

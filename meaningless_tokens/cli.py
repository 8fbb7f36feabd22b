"""The command line the per-model stages share: `python -m stages.<stage> --model NAME [--params FILE]`.

Bad input (any StageError) is one `error: ...` line and exit status 2, and so is a filesystem fault (full disk,
read-only or missing folder, permission denied: `error: <path>: <reason>`); Ctrl-C is exit status 130.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from meaningless_tokens.config import PARAMS_FILE, StageError, load_params
from meaningless_tokens.store import os_error_line


def main(stage: str, doc: str | None, run: Callable, argv: list[str] | None = None, per_model: bool = True) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m stages.{stage}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if per_model:
        ap.add_argument("--model", required=True, help="model name from params.yaml")
    ap.add_argument("--params", default=str(PARAMS_FILE))
    args = ap.parse_args(argv)
    try:
        params = load_params(args.params)
        run(params, args.model) if per_model else run(params)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a filesystem fault the stage met outside the writers (store.py names those)
        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


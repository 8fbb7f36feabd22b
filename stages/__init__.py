"""One module per dvc.yaml stage, each run as `python -m stages.<name>`: such a process hands itself to the warm-start
server first (meaningless_tokens/forkserver.py: torch and transformers imported once per run, not once per stage)."""

import sys

if sys.orig_argv[1:2] == ["-m"] and sys.orig_argv[2:3] and sys.orig_argv[2].startswith(f"{__name__}."):
    from meaningless_tokens.forkserver import delegate

    delegate(sys.orig_argv[2])  # exits with the stage's status, or returns: run it in this process

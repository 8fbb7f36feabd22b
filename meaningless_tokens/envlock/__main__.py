"""`python -m meaningless_tokens.envlock`: the command line (cli.main)."""

import sys

from meaningless_tokens.envlock.cli import main

sys.exit(main())

import sys

from meaningless_tokens.config.cli import main

sys.exit(main())

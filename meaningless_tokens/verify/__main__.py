"""`python -m meaningless_tokens.verify [REV]`: the driver's command line (driver.main)."""

import sys

from meaningless_tokens.verify.driver import main

sys.exit(main())

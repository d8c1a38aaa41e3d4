"""`python -m dpfl.cli ...`: the `dpfl` command without its installed script (e.g. from a source checkout)."""

import sys

from dpfl.cli import main

sys.exit(main())

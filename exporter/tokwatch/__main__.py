"""`python -m tokwatch` runs the command line."""

import sys

from tokwatch.entry import main

sys.exit(main())

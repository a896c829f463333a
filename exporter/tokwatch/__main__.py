"""`python -m tokwatch` runs the command line."""

import sys

from tokwatch.cli import main

sys.exit(main())

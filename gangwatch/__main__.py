"""`python -m gangwatch ...` runs the command line, as the `gangwatch` script does."""

import sys

from gangwatch.cli import main

sys.exit(main())

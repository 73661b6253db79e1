"""`python -m tspbench.verify scheme=tsp degree=4 ...` (tspbench.verify.cli.main)."""

import sys

from tspbench.verify.cli import main

sys.exit(main())

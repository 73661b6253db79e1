"""`python -m tspbench.verify scheme=tsp degree=4 ...` (tspbench.verify.parity.main)."""
import sys

from tspbench.verify.parity import main

sys.exit(main())

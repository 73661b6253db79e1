"""`python -m tspbench.estimate ...`: entry point; the CLI lives in tspbench.predict.estimate_cli."""

import sys

from tspbench.predict.estimate_cli import main

if __name__ == "__main__":
    sys.exit(main())

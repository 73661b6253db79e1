"""`python -m tspbench.estimate ...`: entry point; the estimate lives in tspbench.predict.estimate."""
import sys

from tspbench.predict.estimate import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m tspbench.gpu_check ...`: entry point; the check lives in tspbench.predict.gpu_check."""

import sys

from tspbench.predict.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())

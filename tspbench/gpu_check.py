"""`python -m tspbench.gpu_check ...`: entry point; the check lives in tspbench.predict.gpu_check, and `--time`'s
calibration file is written through tspbench.record (atomic, guarded: docs/records.md#calibration-files)."""

import sys
from pathlib import Path

from tspbench.predict.gpu_check import main
from tspbench.record.store import write_json


def write_calibration(path: Path, calib: dict) -> dict:
    """conf/hardware/<name>.calibration.json content, written atomically after the calibration guard."""
    return write_json(path, calib, kind="calibration")


if __name__ == "__main__":
    sys.exit(main(write_calibration=write_calibration))

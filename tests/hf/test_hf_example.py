"""examples/train_tsp_hf.py runs under torchrun at 2 CPU ranks (gloo): exit 0 and a finite loss every step."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]') is not installed")

ROOT = Path(__file__).resolve().parents[2]


def test_example_trains_with_torchrun():
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "examples" / "train_tsp_hf.py"), "3"], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", proc.stdout, re.M)]
    assert len(losses) == 3, proc.stdout
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(256)) < 1.0  # random weights: about the uniform loss ln V

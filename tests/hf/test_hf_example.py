"""examples/train_tsp_hf.py runs under torchrun at 2 CPU ranks (gloo): exit 0 and a finite loss every step. Its GPU
branch (GPU review finding 3) runs on the same CPU ranks under tests/hf/mock_cuda_run.py, which answers "CUDA
available" and records the CUDA calls: each rank sets its own device (LOCAL_RANK) before the process group and
before the model goes to the GPU; without it every rank's model.cuda() lands on cuda:0 and NCCL refuses the
duplicate GPU. What it cannot check on CPU: that NCCL and CUDA run (a GPU test does)."""

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


def _torchrun(*script: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run([*cmd, *script], env=env, capture_output=True, text=True, timeout=180)


def test_example_trains_with_torchrun():
    proc = _torchrun(str(ROOT / "examples" / "train_tsp_hf.py"), "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", proc.stdout, re.M)]
    assert len(losses) == 3, proc.stdout
    assert all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(256)) < 1.0  # random weights: about the uniform loss ln V


def test_example_on_gpus_sets_each_ranks_device_before_cuda():
    proc = _torchrun(str(ROOT / "tests" / "hf" / "mock_cuda_run.py"), str(ROOT / "examples" / "train_tsp_hf.py"), "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        # two ranks print to one pipe: a line may be split by the other rank's, so match up to the next "[mock"
        calls = [c.strip() for c in re.findall(rf"\[mock rank {rank}\] (.*?)(?=\[mock rank|\n|$)", proc.stdout)]
        assert calls == [f"set_device {rank}", "init_process_group nccl", f"cuda onto {rank}"], (
            proc.stdout + proc.stderr[-2000:]
        )
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", proc.stdout, re.M)]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)

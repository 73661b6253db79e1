"""`hydra/launcher=slurm_8gpu` where it cannot work gets one line and exit 2 before Hydra starts (no directory, no
submitit traceback): on a machine without Slurm's `srun`, and without -m (Hydra would ignore the launcher and run
the grid here). tspbench.run.slurm.refused_launcher decides it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tspbench.run.slurm import refused_launcher

ROOT = Path(__file__).resolve().parents[2]


def no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """This environment without Slurm: no SLURM_* variables, PATH an empty folder (no srun, whatever the host)."""
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SUBMITIT"))}
    return dict(env, PATH=str(tmp_path / "bin"), PYTHONPATH=str(ROOT))


@pytest.mark.parametrize(
    "args, why",
    [
        (["-m", "+exp=smoke", "hydra/launcher=slurm_8gpu"], "srun is not on PATH"),
        (["+exp=smoke", "hydra/launcher=slurm_8gpu"], "launches only a sweep; allowed: add -m"),
    ],
)
def test_slurm_launcher_without_slurm_is_refused_in_one_line(tmp_path, args, why):
    run = tmp_path / "cwd"
    run.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "tspbench", *args], cwd=run, env=no_slurm_env(tmp_path), capture_output=True, text=True
    )
    assert p.returncode == 2 and p.stdout == "", p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith("tspbench: hydra/launcher=slurm_8gpu ") and why in line
    assert not list(run.iterdir())  # nothing started: no multirun/, results/ or .submitit/


def test_which_launchers_are_refused():
    no_srun, srun = (lambda name: None), (lambda name: f"/usr/bin/{name}")
    assert refused_launcher(["+exp=smoke"], multirun=True, which=no_srun) is None  # Hydra's basic launcher
    assert refused_launcher(["hydra/launcher=basic"], multirun=False, which=no_srun) is None
    assert refused_launcher(["hydra/launcher=submitit_local"], multirun=True, which=no_srun) is None
    assert refused_launcher(["hydra/launcher=slurm_8gpu"], multirun=True, which=srun) is None  # a login node
    assert "srun" in (refused_launcher(["hydra/launcher=submitit_slurm"], multirun=True, which=no_srun) or "")
    assert "add -m" in (refused_launcher(["hydra/launcher=submitit_local"], multirun=False, which=srun) or "")

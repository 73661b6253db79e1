"""scripts/device_check.sh, its CPU-runnable parts: `--dry-run OUTDIR` lists the commands (into OUTDIR, nothing
run), and each python command it would run on the GPU is checked here on CPU: the test paths exist and hold
GPU-marked tests, gpu_check accepts its flags (its per-case check stubbed), the smoke experiment composes and
expands to valid single-GPU runs."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]


def _commands(tmp_path: Path) -> list[list[str]]:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/device_check.sh"), "--dry-run", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "commands.txt").read_text().splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commands.txt"]  # a dry run runs nothing
    return [shlex.split(line) for line in lines]


def test_dry_run_lists_gpu_tests_memory_check_and_smoke(tmp_path):
    cmds = _commands(tmp_path)
    mods = [c[c.index("-m") + 1] for c in cmds]
    assert mods == ["pytest", "tspbench.gpu_check", "tspbench"]
    pytest_args = cmds[0][cmds[0].index("-m", 3) :]
    assert pytest_args[:2] == ["-m", "gpu"] and all((ROOT / p).exists() for p in pytest_args[2:])
    assert any("pytest.mark.gpu" in f.read_text() for f in (ROOT / "tests/gpu").glob("test_*.py"))
    # everything the run writes goes under OUTDIR
    assert any(a == f"hydra.run.dir={tmp_path}/run" for a in cmds[2])


def test_gpu_check_flags_parse(tmp_path, capsys):
    from tspbench.predict import gpu_check

    cmd = _commands(tmp_path)[1]
    args = cmd[cmd.index("tspbench.gpu_check") + 1 :]
    with mock.patch.object(gpu_check, "check", lambda model, par, seq, device: {"scheme": par.scheme}):
        assert gpu_check.main(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(gpu_check.CASES)


def test_smoke_overrides_compose_to_single_gpu_runs(tmp_path):
    from tspbench.run.grid import compose_experiment, expand_grid

    cmd = _commands(tmp_path)[2]
    overrides = [a for a in cmd[cmd.index("tspbench") + 1 :] if not a.startswith("hydra.")]
    specs = expand_grid(compose_experiment(overrides))
    assert sorted(s.mode for s in specs) == ["decode", "forward", "train"]
    assert all(s.world_size == 1 and s.device == "cuda" for s in specs)

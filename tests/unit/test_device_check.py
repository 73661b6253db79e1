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


def _steps(tmp_path: Path) -> list[tuple[int, int, list[str]]]:
    """(time limit s, GPUs needed, argv) of each step the dry run lists."""
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
    heads, cmds = lines[0::2], lines[1::2]
    limits = [int(h.split("limit ")[1].split("s")[0]) for h in heads]
    gpus = [int(h.split("needs ")[1].split(" ")[0]) for h in heads]
    return [(t, g, shlex.split(c)) for t, g, c in zip(limits, gpus, cmds)]


def _commands(tmp_path: Path) -> list[list[str]]:
    return [c for _, _, c in _steps(tmp_path)]


def test_dry_run_lists_gpu_tests_memory_check_and_smoke(tmp_path):
    cmds = _commands(tmp_path)
    mods = [c[c.index("-m") + 1] for c in cmds]
    assert mods == [
        "pytest",
        "tspbench.gpu_check",
        "tspbench.gpu_check",
        "tspbench.gpu_check",
        "tspbench",
        "pytest",
        "tspbench",
    ]
    assert "time=true" in cmds[2] and f"calibration_out={tmp_path}/logs" in cmds[2]
    assert "shapes=true" in cmds[3]
    assert all("hardware=auto" in c for c in cmds[2:4])  # the device names its profile, never a fixed one
    for c in (cmds[0], cmds[5]):
        pytest_args = c[c.index("-m", 3) :]
        assert pytest_args[:2] == ["-m", "gpu"] and all((ROOT / p).exists() for p in pytest_args[2:])
    assert any("pytest.mark.gpu" in f.read_text() for f in (ROOT / "tests/gpu").glob("test_*.py"))
    # everything the run writes goes under OUTDIR
    assert any(a == f"hydra.run.dir={tmp_path}/logs/run" for a in cmds[4])


def test_step_limits_fit_a_short_loan_and_nccl_steps_need_two_gpus(tmp_path):
    steps = _steps(tmp_path)
    assert sum(t for t, _, _ in steps) <= 360  # rerunnable inside a 15-minute loan, start-up included
    nccl = [c for _, g, c in steps if g >= 2]
    assert len(nccl) == 2 and "tests/gpu/test_nccl_bf16.py" in nccl[0]
    assert any(a.startswith("batches=") for a in nccl[1]) and "modes=[train,decode]" in nccl[1]


def test_gpu_check_options_parse(tmp_path, capsys):
    from tspbench import gpu_check as command
    from tspbench.predict import gpu_check

    cmd = _commands(tmp_path)[1]
    args = cmd[cmd.index("tspbench.gpu_check") + 1 :]
    with (
        mock.patch.object(gpu_check, "check", lambda model, par, seq, device: {"scheme": par.scheme}),
        mock.patch.object(gpu_check.torch.cuda, "is_available", lambda: True),
    ):
        assert command.main(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(gpu_check.CASES)


def test_smoke_overrides_compose_to_single_gpu_runs(tmp_path):
    from tspbench.run.experiment import compose_experiment
    from tspbench.run.grid import expand_grid

    cmd = _commands(tmp_path)[4]
    overrides = [a for a in cmd[cmd.index("tspbench") + 1 :] if not a.startswith("hydra.")]
    specs = expand_grid(compose_experiment(overrides))
    assert sorted(s.mode for s in specs) == ["decode", "forward", "train"]
    assert all(s.world_size == 1 and s.device == "cuda" for s in specs)


def test_gpu_time_refuses_cpu_in_one_line(capsys):
    """`gpu_check time=true` needs CUDA events: on this machine it says so in one line and exits 2."""
    from tspbench.gpu_check import main

    assert main(["device=cpu", "time=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "time=true needs a CUDA device" in err


def test_calibration_record_is_what_load_hardware_applies(tmp_path):
    """The calibration the GPU run writes (from op times and FLOPs) is a file load_hardware accepts; an
    impossible efficiency (above the peak) is refused, never written."""
    import shutil

    import pytest

    from tspbench.gpu_check import write_calibration  # the writer `python -m tspbench.gpu_check time=true` uses
    from tspbench.predict.costmodel.hardware import CONF_DIR, load_hardware
    from tspbench.predict.gpu_time import calibration_record

    peak = 989.4e12
    flops = {"gemm": 4e12, "attention_forward": 2e12, "attention_backward": 5e12}
    rec = calibration_record(
        {"gemm": 8e-3, "attention_forward": 8e-3, "attention_backward": 25e-3}, flops, peak, "NVIDIA H200"
    )
    assert rec["efficiency"]["gemm"] == pytest.approx(4e12 / (8e-3 * peak))
    shutil.copy(CONF_DIR / "h200.yaml", tmp_path / "h200.yaml")
    written = write_calibration(tmp_path / "h200.calibration.json", rec)  # atomic, through its kind's guard
    assert written == {**rec, "status": "ok"}
    hw = load_hardware("h200", tmp_path)
    assert hw.matmul_efficiency == pytest.approx(rec["efficiency"]["gemm"]) and hw.calibration
    with pytest.raises(ValueError, match="implausible efficiency"):
        calibration_record({"gemm": 1e-3, "attention_forward": 8e-3, "attention_backward": 25e-3}, flops, peak, "X")

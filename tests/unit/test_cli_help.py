"""`--help` works on every entry point and lists the options with their meaning (in process: the same
functions `python -m ...` calls)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def _run(main, argv, capsys) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's --help exits 0
        rc = e.code
    assert rc in (0, None)
    return capsys.readouterr().out


def test_verify_help(capsys):
    from tspbench.verify.__main__ import main

    out = _run(main, ["--help"], capsys)
    assert "usage: python -m tspbench.verify" in out
    assert "seq_len=32" in out and "model.n_kv_heads=8" in out  # composed defaults (conf/model/tiny.yaml)
    assert "Data-parallel replicas; world size = dp × degree." in out  # a field's docstring


def test_estimate_help(capsys):
    from tspbench.estimate import main

    out = _run(main, ["-h"], capsys)
    assert "usage: python -m tspbench.estimate" in out and "model.dim=4096" in out and "hardware=null" in out
    profiles = " | ".join(
        sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "hardware").glob("*.yaml"))
    )
    assert f"profiles: {profiles}" in " ".join(out.split()) and "h100 | h100_96gb" in profiles  # derived from conf/


def test_experiment_help(capsys, monkeypatch):
    import tspbench.__main__ as entry

    monkeypatch.setattr(sys, "argv", ["tspbench", "+exp=smoke", "--help"])
    entry.print_help()
    out = capsys.readouterr().out
    assert "usage: python -m tspbench" in out and "exp_name=smoke" in out  # the experiment's own values
    assert "Wall-clock limit per run" in out and "experiments (+exp=NAME):" in out


@pytest.mark.parametrize("module", ["tspbench.report.__main__", "tspbench.gpu_check", "tspbench.validate"])
def test_key_value_entry_points_help(module, capsys):
    import importlib

    out = _run(importlib.import_module(module).main, ["--help"], capsys)
    assert out.startswith("usage: python -m tspbench.") and "options (key=value" in out and "examples:" in out


def test_plan_help(capsys):
    from tspbench.plan import main

    out = _run(main, ["--help"], capsys)
    assert out.startswith("usage: python -m tspbench.plan")
    assert "overlap=schedule" in out and "none | ideal | schedule" in out and "out=null" in out and "batches=" in out

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


def test_every_model_option_names_hf_path(capsys, monkeypatch):
    """Every command with a `model` option says in --help that it also takes model=hf:PATH (cli.HF_HELP); those
    are the experiment, estimate, verify and plan (the others take no model)."""
    import importlib

    import tspbench.__main__ as entry

    monkeypatch.setattr(sys, "argv", ["tspbench", "--help"])
    entry.print_help()
    outs = {"tspbench": capsys.readouterr().out}
    for module in ("estimate", "verify.__main__", "plan", "gpu_check", "validate", "headline", "report.__main__"):
        outs[module] = _run(importlib.import_module(f"tspbench.{module}").main, ["--help"], capsys)
    with_model = {m for m, out in outs.items() if "\n  model=" in out}
    assert with_model == {"tspbench", "estimate", "verify.__main__", "plan"}
    said = {m for m in with_model if "model=hf:PATH: a Hugging Face config.json" in " ".join(outs[m].split())}
    assert said == with_model  # (the help wraps lines: compared with whitespace collapsed)

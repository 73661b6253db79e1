"""One way to place a command (README.md, "Commands"): `python -m tspbench[.NAME]` is the module tspbench/NAME.py, or
the package's __main__.py when NAME is a package; it holds the command line only (typed key=value options, `--help`
from their attribute docstrings, printing, exit codes) and calls library code. No library module is a command."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "tspbench": "tspbench/__main__.py",
    "tspbench.verify": "tspbench/verify/__main__.py",
    "tspbench.estimate": "tspbench/estimate.py",
    "tspbench.gpu_check": "tspbench/gpu_check.py",
    "tspbench.plan": "tspbench/plan.py",
    "tspbench.validate": "tspbench/validate.py",
    "tspbench.report": "tspbench/report/__main__.py",
    "tspbench.headline": "tspbench/headline.py",
    "tspbench.run.worker": "tspbench/run/worker.py",
}
MAIN_GUARD = re.compile(r'^if __name__ == "__main__":', re.M)


def _module(name: str):
    path = COMMANDS[name]
    return importlib.import_module(path.removesuffix(".py").replace("/", "."))


def test_only_commands_are_runnable():
    """Every module with a `__main__` guard is a listed command, and every command has one and a main()."""
    runnable = {str(p.relative_to(ROOT)) for p in (ROOT / "tspbench").rglob("*.py") if MAIN_GUARD.search(p.read_text())}
    assert runnable == set(COMMANDS.values())
    for path in COMMANDS.values():
        tree = ast.parse((ROOT / path).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), path


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "tspbench"])
def test_help_has_one_style(name, capsys):
    """`--help`: usage with key=value options, the options table from the typed config, examples."""
    rc = _module(name).main(["--help"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith(f"usage: python -m {name} [key=value ...]")
    assert "options (key=value; every field of the typed config, with its default):" in out and "examples:" in out


def test_experiment_help_has_the_same_style(capsys, monkeypatch):
    import tspbench.__main__ as entry

    monkeypatch.setattr(sys, "argv", ["tspbench", "--help"])
    entry.print_help()
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m tspbench [key=value ...]") and "examples:" in out
    assert "options (key=value; every field of the typed config, with its default):" in out


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "tspbench"])
def test_a_misspelt_key_gets_one_line_and_exit_2(name, capsys):
    rc = _module(name).main(["no_such_key=1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no_such_key" in err and "Traceback" not in err, err


def test_the_readme_lists_every_command():
    text = (ROOT / "README.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    for name, path in COMMANDS.items():
        assert f"python -m {name} " in text or f"python -m {name}`" in text, name
        assert f"`{path}`" in text, path

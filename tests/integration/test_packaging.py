"""A normal, non-editable install works from any directory: the wheel carries conf/ (as tspbench.conf), verify
and a smoke experiment run from a directory that is not the repository, and results and reports land under
that working directory, not next to the installed package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    # A copy of the checkout, so the build leaves nothing (build/, *.egg-info) in the user's tree.
    src = tmp_path_factory.mktemp("src") / "tspbench"
    skip = shutil.ignore_patterns(
        ".git",
        "build",
        "*.egg-info",
        "results",
        "reports",
        "outputs",
        "multirun",
        "__pycache__",
        ".benchmarks",
        ".pytest_cache",
    )
    shutil.copytree(ROOT, src, ignore=skip)
    # --no-deps: torch, Hydra, pandas come from this environment; --no-build-isolation: no download of
    # setuptools; a wheel is built and installed (not an editable link to the checkout).
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    proc = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (target / "tspbench" / "conf" / "config.yaml").exists(), "conf/ is not in the wheel"
    assert (target / "tspbench" / "report" / "templates").is_dir()
    return target


def _files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def test_the_installed_conf_is_every_file_of_conf(installed):
    """Every file under conf/ at any depth (conf/hydra/launcher/, conf/model/hf/, ...) is in the installed package."""
    assert _files(ROOT / "conf") == _files(installed / "tspbench" / "conf")


def run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(installed))
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_installed_package_is_the_one_imported(installed, tmp_path):
    p = run(
        installed, tmp_path, "-c", "import tspbench, tspbench.paths as p; print(tspbench.__file__); print(p.conf_dir())"
    )
    assert p.returncode == 0, p.stderr
    pkg, conf = p.stdout.split()
    assert Path(pkg).is_relative_to(installed) and Path(conf) == installed / "tspbench" / "conf"


def test_verify_from_another_directory(installed, tmp_path):
    p = run(installed, tmp_path, "-m", "tspbench.verify", "scheme=tp", "degree=2")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "PASS" in p.stdout


def test_smoke_experiment_from_another_directory(installed, tmp_path):
    p = run(
        installed,
        tmp_path,
        "-m",
        "tspbench",
        "+exp=smoke",
        "schemes=[tp]",
        "seq_len=32",
        "model.n_layers=1",
        "warmup_steps=1",
        "measured_steps=2",
        "progress=false",
        "memory_breakdown=false",
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = list((tmp_path / "results").rglob("results.jsonl"))
    reports = list((tmp_path / "reports").glob("smoke-*.html"))
    assert len(results) == 1 and len(reports) == 1, (results, reports)
    assert '"status": "ok"' in results[0].read_text()
    assert not (installed / "results").exists() and not (installed / "reports").exists()

"""An install carries every file under conf/ (as tspbench.conf): what setuptools' build_py would copy, from
setup.py's own arguments, equals conf/ on disk. No wheel is built (tests/integration/test_packaging.py, slow, builds
one and checks the installed tree the same way)."""

from __future__ import annotations

import runpy
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def conf_on_disk() -> set[str]:
    """Every file under conf/, relative to it, but Python's caches."""
    return {
        str(p.relative_to(CONF))
        for p in CONF.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def conf_in_a_build(monkeypatch) -> set[str]:
    """The files under tspbench.conf that `pip install` / a wheel would carry: build_py's modules and data files,
    computed by setuptools from the arguments setup.py passes (nothing is built or copied)."""
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    from setuptools.command.build_py import build_py
    from setuptools.dist import Distribution

    dist = Distribution({"name": "tspbench", **captured})
    dist.script_name = "setup.py"
    cmd = build_py(dist)
    cmd.ensure_finalized()
    files = {f for pkg, _src, _build, names in cmd.data_files if pkg == "tspbench.conf" for f in names}
    modules = {f"{m}.py" for pkg, m, _path in cmd.find_all_modules() if pkg == "tspbench.conf"}
    return files | modules


def test_every_conf_file_ships(monkeypatch):
    on_disk, shipped = conf_on_disk(), conf_in_a_build(monkeypatch)
    assert any("/" in f and f.count("/") >= 2 for f in on_disk)  # nested files exist (conf/hydra/launcher/...)
    assert on_disk - shipped == set(), "in conf/ but not in an install: fix setup.py's CONF_DATA"
    assert shipped - on_disk == set()

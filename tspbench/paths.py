"""Where tspbench's files are: the configuration shipped with the package, and the user's output folders.

The one place that knows. Configuration (conf/: model, hardware, experiment presets, claims) sits at the
repository's top level, where users look for it, and is installed as the package `tspbench.conf`
(pyproject.toml maps one onto the other), so a wheel carries it. Results and reports are written under the
current working directory, never next to the installed package.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import tspbench

PACKAGE_DIR = Path(tspbench.__file__).resolve().parent
"""The imported tspbench package (a source checkout, an editable install or site-packages)."""


def conf_dir() -> Path:
    """The configuration root (Hydra's primary config directory): the conf/ beside the imported package when it
    is a source checkout (so a git worktree or an edited checkout reads its own files), else `tspbench.conf`
    as installed."""
    checkout = PACKAGE_DIR.parent / "conf"
    if (checkout / "config.yaml").is_file():
        return checkout
    return Path(str(resources.files("tspbench.conf")))


def templates_dir() -> Path:
    """The report's Jinja templates (package data of tspbench.report)."""
    return PACKAGE_DIR / "report" / "templates"


def package_search_root() -> Path:
    """The directory that contains the imported `tspbench` (prepended to PYTHONPATH for spawned ranks, so
    they import the same code as the parent, installed or not)."""
    return PACKAGE_DIR.parent


def reports_dir() -> Path:
    """Default reports folder: ./reports under the current working directory."""
    return Path.cwd() / "reports"

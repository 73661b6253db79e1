"""Packaging: everything is in pyproject.toml except the one thing it cannot say, that the repository's
top-level conf/ (where users look for experiment files) is installed as the package `tspbench.conf`, so a
wheel or a non-editable install carries the configuration (tspbench.paths.conf_dir finds it there).

Every file under conf/, at any depth (conf/hydra/launcher/*.yaml, conf/model/hf/*.json, ...), ships:
`CONF_DATA` globs them recursively by kind; tests/unit/test_package_data.py compares it with conf/ on disk."""

from setuptools import find_packages, setup

CONF_DATA = [f"**/*.{ext}" for ext in ("yaml", "yml", "json", "md", "txt", "csv")]
"""Package data of tspbench.conf: every configuration file at any depth (`**/` matches the top level too)."""

setup(
    packages=[*find_packages(include=["tspbench", "tspbench.*"]), "tspbench.conf"],
    package_dir={"tspbench.conf": "conf"},
    package_data={"tspbench": ["report/templates/*"], "tspbench.conf": CONF_DATA},
)

"""Packaging: everything is in pyproject.toml except the one thing it cannot say, that the repository's
top-level conf/ (where users look for experiment files) is installed as the package `tspbench.conf`, so a
wheel or a non-editable install carries the configuration (tspbench.paths.conf_dir finds it there)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tspbench", "tspbench.*"]), "tspbench.conf"],
    package_dir={"tspbench.conf": "conf"},
    package_data={"tspbench": ["report/templates/*"], "tspbench.conf": ["*.yaml", "*/*.yaml"]},
)

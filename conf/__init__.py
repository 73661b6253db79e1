"""tspbench's configuration, installed as the package `tspbench.conf` (pyproject.toml / setup.py map this folder
onto it) so an installed tspbench carries its presets. Hydra reads the YAML files; there is no code here."""

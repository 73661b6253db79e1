"""Where the Hydra configuration lives, and the structured schemas registered in Hydra's ConfigStore."""
from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore

from tspbench.config import ModelConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
"""The repository's conf/ (model/, scheme/, hardware/, exp/ groups)."""


def register() -> ConfigStore:
    cs = ConfigStore.instance()
    cs.store(group="model", name="model_schema", node=ModelConfig)
    return cs

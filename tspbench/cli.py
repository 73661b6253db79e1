"""Where the Hydra configuration lives, and the structured schemas registered in Hydra's ConfigStore."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from tspbench.config import ModelConfig
from tspbench.paths import conf_dir

CONF_DIR = conf_dir()
"""The configuration root (model/, scheme/, hardware/, exp/ groups; tspbench.paths)."""


def register() -> ConfigStore:
    cs = ConfigStore.instance()
    cs.store(group="model", name="model_schema", node=ModelConfig)
    return cs

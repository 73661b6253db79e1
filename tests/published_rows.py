"""One published row written to a YAML file, for the tests of conf/published's loader (tspbench/predict/published.py):
a small in-scope FSDP row that the tests change one field at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

BASE: dict[str, Any] = {
    "id": "x",
    "source": "s",
    "subset": "calibration",
    "hardware": "a100",
    "gpus": 4,
    "model": {"vocab_size": 1000, "dim": 256, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "ffn_hidden": 512},
    "layout": {"scheme": "single", "degree": 1, "fsdp": True},
    "seq_len": 1024,
    "micro_batch": 1,
    "recompute": "full",
    "precision": "bf16",
    "measured": {"peak_mem_gib": 10.0},
}
"""The row: its fields, each overridable."""


def write_row(tmp_path: Path, **fields: Any) -> Path:
    """A rows.yaml under tmp_path holding BASE with `fields` replaced."""
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump({"rows": [{**BASE, **fields}]}))
    return path

"""tspbench: reference implementations, measurements and models of Tensor and Sequence Parallelism (TSP,
arXiv 2604.26294) and its baselines (tp, tp_msp, sp, tp_sp), proven equal to a single-device model.

`tspbench.parallelize(model, scheme="tsp", degree=..., seq_len=...)` shards a Hugging Face Llama-family model
(tspbench/hf/parallelize.py); it is imported on first use, so `import tspbench` loads neither torch.distributed's
schemes nor transformers."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "parallelize"]


def __getattr__(name: str) -> Any:
    """PEP 562 lazy export: `tspbench.parallelize` (a top-level facility of the package, resolved at first use;
    importlib keeps this root module from importing the layers above it at import time)."""
    if name == "parallelize":
        return importlib.import_module("tspbench.hf.parallelize").parallelize
    raise AttributeError(f"module 'tspbench' has no attribute {name!r}")

"""Scheme registry: name → module exposing `apply(cfg, par, args) -> ParallelModel`.

single (reference), tp (Megatron TP), tp_msp (TP + Megatron sequence parallelism), sp (token sharding =
context parallelism; allgather or ring), tp_sp (T × Σ mesh), tsp (the paper's folded axis).
"""

from __future__ import annotations

import importlib

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.ops.sharding import ApplyArgs, build_mesh

__all__ = ["ApplyArgs", "ParallelModel", "apply_scheme", "build_mesh"]


def apply_scheme(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    return importlib.import_module(f"tspbench.schemes.{par.scheme}").apply(cfg, par, args)

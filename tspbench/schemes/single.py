"""single — the unsharded reference model, optionally data-parallel (world = dp).

No communication inside the model; after backward the gradients are averaged over DP replicas.
"""

from __future__ import annotations

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.ops.sharding import ApplyArgs, materialise_replicated, meta_model


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    module, shards = meta_model(cfg, par.recompute)
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=None)
    return ParallelModel(module, par, shards, args)

"""FSDP×SP — token sharding with fully sharded weights: torchtitan's recipe with context parallelism
(docs/method.md#fsdp-sp).

Tokens: exactly `sp` — rank p of the Σ-rank sequence group holds the zigzag shard {chunk p, chunk 2Σ−1−p}, and
attention exchanges K/V over the group (all-gather of the packed [K; V], or the ring; SPAttention below is sp's
module). Weights: parameters, gradients and optimizer state are sharded by PyTorch FSDP2 (`fully_shard`) over
the flattened dp × Σ mesh of N = dp·Σ ranks, so every rank holds dim-0 row chunk r of every weight (1/N of it,
a DTensor). Units: one per decoder block, one for the embedding, one for the final norm + LM head (the root
owns nothing). Each block unit is all-gathered just before its forward (the next block's gather is prefetched),
freed after it (reshard_after_forward=True), all-gathered again before its backward (the previous block's is
prefetched) and its gradient reduce-scattered after it; the head unit, used again at once by backward, stays
gathered (torchtitan's choice).

Gradient. Rank (d, σ)'s loss is its share of replica d's mean token loss (the Σ shares sum to it), so the right
gradient is Σ over the sequence group, averaged over dp: FSDP's reduce-scatter sums over all N ranks and
divides by `set_gradient_divide_factor(dp)` (its default, N, would be Σ× too small). FSDP reduces every
gradient itself: the Shard entries say `fsdp=True` and ParallelModel.finish_grad_sync skips them.

Communication per layer (W = the block's weights; N = dp·Σ; received per rank):
    forward   all-gather of W: W·(N−1)/N; K/V exchange as sp: 2·B·S·(h/g)·(Σ−1)/Σ
    backward  all-gather of W again + reduce-scatter of dW: 2·W·(N−1)/N; dK/dV as sp
FSDP's collectives are recorded in the CommLog through its custom-collective hooks (`set_custom_all_gather`,
`set_custom_reduce_scatter`), tagged with the unit's layer.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    ApplyArgs,
    Shard,
    check_shards,
    materialise_replicated,
    meta_model,
    replicated_weights,
)
from tspbench.schemes.sp import SPAttention


def _phase() -> str:
    return "bwd" if torch._C._current_graph_task_id() != -1 else "fwd"


class LoggedAllGather(DefaultAllGather):
    """FSDP2's own all-gather, recorded in the CommLog under the unit's tag (output: the unit's padded weights)."""

    def __init__(self, comm: Comm, tag: str):
        self.comm, self.tag = comm, tag

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        n = self.comm.size
        self.comm.record("all_gather", output_tensor, output_tensor.numel() * (n - 1) / n, _phase(), self.tag)
        return super().__call__(output_tensor, input_tensor, group, async_op)


class LoggedReduceScatter(DefaultReduceScatter):
    """FSDP2's own gradient reduce-scatter, recorded under the unit's tag (input: the unit's padded gradients)."""

    def __init__(self, comm: Comm, tag: str):
        self.comm, self.tag = comm, tag

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        n = self.comm.size
        self.comm.record("reduce_scatter", input_tensor, input_tensor.numel() * (n - 1) / n, "bwd", self.tag)
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def fsdp_mesh(args: ApplyArgs) -> DeviceMesh:
    """The 1-D mesh FSDP shards over: dp × sp flattened (torchtitan's dp_shard_cp), or sp when dp = 1."""
    names = [a for a in ("dp", "sp") if args.comm(a) is not None]
    if len(names) == 1:
        return args.mesh[names[0]]
    return args.mesh[tuple(names)]._flatten("+".join(names))


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    sp = args.need("sp")
    layout = SeqLayout(args.seq_len, sp.size, sp.rank, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    for block in module.blocks:  # sp's attention module; MLP, norms: the reference modules
        block.attention = SPAttention(replicated_weights(block.attention, ATTN_SPLIT), sp, layout, cfg, par.sp_variant)
    # full seeded values first (as every scheme: "build full, then shard"); fully_shard keeps row chunk r
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=None)
    flat = args.flat("dp", "sp")
    assert flat is not None
    mesh = fsdp_mesh(args)
    units: list[tuple[str, FSDPModule]] = []
    for i, block in enumerate(module.blocks):
        units.append((f"layer{i}", fully_shard(block, mesh=mesh, reshard_after_forward=True)))
    units.append(("embed", fully_shard(module.embed, mesh=mesh, reshard_after_forward=True)))
    fully_shard([module.norm, module.lm_head], mesh=mesh, reshard_after_forward=False)  # one unit, two modules
    units.append(("head", module.norm))  # type: ignore[arg-type]  # either module reaches the shared state
    fully_shard(module, mesh=mesh)  # the root: owns no parameter, drives the units' lazy init and final callback
    dp = args.comm("dp")
    dp_size = dp.size if dp is not None else 1
    for tag, unit in units:
        unit.set_custom_all_gather(LoggedAllGather(flat, tag))
        unit.set_custom_reduce_scatter(LoggedReduceScatter(flat, tag))
        unit.set_gradient_divide_factor(float(dp_size))  # sum over Σ (token shares), mean over dp
        unit.set_force_sum_reduction_for_comms(True)  # SUM then divide: gloo has no PREMUL_SUM
    blocks = [b for b in module.blocks]
    for prev, nxt in zip(blocks, blocks[1:]):  # explicit prefetch, one block ahead each way
        prev.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
        nxt.set_modules_to_backward_prefetch([prev])  # type: ignore[operator]
    for name in shards:  # every weight is FSDP's: row-sharded over dp × Σ, its gradient reduce-scattered by FSDP
        shards[name] = Shard(name, 0, flat, fsdp=True)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=sp)

"""FSDP×SP — token sharding with fully sharded weights: torchtitan's recipe with context parallelism, as HSDP
(docs/method.md#fsdp-sp).

Tokens: exactly `sp` — rank p of the Σ-rank sequence group holds the zigzag shard {chunk p, chunk 2Σ−1−p}, and
attention exchanges K/V over the group (all-gather of the packed [K; V], or the ring; SPAttention below is sp's
module). Weights: parameters, gradients and optimizer state are sharded by PyTorch FSDP2 (`fully_shard`) over the
shard group, dp_shard replicas × Σ flattened (torchtitan's dp_shard_cp), N = dp_shard·Σ ranks, so every rank holds
dim-0 row chunk r of every weight (1/N of it, a DTensor); with dp_shard < dp the mesh is 2-D (replicate, shard) and
FSDP2 runs HSDP: the shard groups are replicas of each other, dp / dp_shard of them (dp_shard = dp: plain FSDP over
all dp·Σ ranks, a 1-D mesh). Units: one per decoder block, one for the embedding, one for the final norm + LM head
(the root owns nothing). Each block unit is all-gathered just before its forward (the next block's gather is
prefetched), freed after it (reshard_after_forward=True), all-gathered again before its backward (the previous
block's is prefetched) and its gradient reduce-scattered after it; the head unit, used again at once by backward,
stays gathered (torchtitan's choice).

Gradient. Rank (d, σ)'s loss is its share of replica d's mean token loss (the Σ shares sum to it), so the right
gradient is Σ over the sequence group, averaged over dp: FSDP's reduce-scatter sums over the N ranks of the shard
group, HSDP's all-reduce (FSDP2's own, per unit, right after its reduce-scatter) sums the 1/N shards over the
R = dp/dp_shard replicate group, and `set_gradient_divide_factor(dp)` divides (its default, dp·Σ, would be Σ× too
small). FSDP reduces every gradient itself: the Shard entries say `fsdp=True` and ParallelModel.finish_grad_sync
skips them.

Communication per layer (W = the block's weights + its 2 norms; N = dp_shard·Σ, R = dp/dp_shard; received per rank):
    forward   all-gather of W: W·(N−1)/N; K/V exchange as sp: 2·B·S·(h/g)·(Σ−1)/Σ
    backward  all-gather of W again + reduce-scatter of dW: 2·W·(N−1)/N; dK/dV as sp;
              HSDP's all-reduce of the unit's 1/N gradient shard over R: 2·(W/N)·(R−1)/R
FSDP's collectives are recorded in the CommLog through its custom-collective hooks (`set_custom_all_gather`,
`set_custom_reduce_scatter`; the all-reduce, which has none, from `set_all_reduce_hook`, run on its output), tagged
with the unit's layer.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from tspbench.config import ModelConfig, require_untied
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


class LoggedAllReduce:
    """HSDP: FSDP2 all-reduces each unit's reduce-scatter output over the replicate group itself (no custom-collective
    hook); its all-reduce hook runs on the result, so the all-reduce is recorded there, under the unit's tag."""

    def __init__(self, comm: Comm, tag: str):
        self.comm, self.tag = comm, tag

    def __call__(self, reduce_output: torch.Tensor) -> None:
        n = self.comm.size
        self.comm.record("all_reduce", reduce_output, 2 * reduce_output.numel() * (n - 1) / n, "bwd", self.tag)


def fsdp_mesh(args: ApplyArgs) -> DeviceMesh:
    """The mesh FSDP shards over: the shard group dp_shard × sp flattened (torchtitan's dp_shard_cp; sp alone when
    dp_shard = 1), 1-D; with replicas of it (dp_replicate > 1) the 2-D (replicate, shard) mesh of FSDP2's HSDP."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    names = [a for a in ("dp_shard", "sp") if args.comm(a) is not None]
    shard = args.mesh[names[0]] if len(names) == 1 else args.mesh[tuple(names)]._flatten("+".join(names))
    if args.comm("dp_replicate") is None:
        return shard
    with unset_fake_temporarily():  # the meshes' rank tables are real tensors, also under the estimate's fakes
        if hasattr(DeviceMesh, "_concatenate"):  # torch ≥ 2.9: the two joined, no flattened dim sliced from the root
            return DeviceMesh._concatenate([args.mesh["dp_replicate"], shard])
        return args.mesh["dp_replicate", "+".join(names)]  # older torch: the flattened dim sliced from the root


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    require_untied(cfg, "scheme=fsdp_sp")
    sp = args.need("sp")
    layout = SeqLayout(args.seq_len, sp.size, sp.rank, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    for block in module.blocks:  # sp's attention module; MLP, norms: the reference modules
        block.attention = SPAttention(replicated_weights(block.attention, ATTN_SPLIT), sp, layout, cfg, par.sp_variant)
    # full seeded values first (as every scheme: "build full, then shard"); fully_shard keeps row chunk r
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=None)
    shard = args.flat("dp_shard", "sp")  # the shard group: N = dp_shard·Σ ranks
    assert shard is not None
    replicate = args.comm("dp_replicate")  # HSDP's replicas of it (None: plain FSDP)
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
        unit.set_custom_all_gather(LoggedAllGather(shard, tag))
        unit.set_custom_reduce_scatter(LoggedReduceScatter(shard, tag))
        if replicate is not None:
            unit.set_all_reduce_hook(LoggedAllReduce(replicate, tag))
        unit.set_gradient_divide_factor(float(dp_size))  # sum over Σ (token shares), mean over dp
        unit.set_force_sum_reduction_for_comms(True)  # SUM then divide: gloo has no PREMUL_SUM
    blocks = [b for b in module.blocks]
    for prev, nxt in zip(blocks, blocks[1:]):  # explicit prefetch, one block ahead each way
        prev.set_modules_to_forward_prefetch([nxt])  # type: ignore[operator]
        nxt.set_modules_to_backward_prefetch([prev])  # type: ignore[operator]
    for name in shards:  # every weight is FSDP's: row-sharded over the shard group, its gradient reduced by FSDP
        shards[name] = Shard(name, 0, shard, fsdp=True)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=sp)

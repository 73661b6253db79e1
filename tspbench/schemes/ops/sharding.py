"""How a scheme builds its rank's part of the model: the process-group mesh, "build full, then shard"
weight slicing, and the Shard spec that says how each local parameter relates to the reference.

A scheme's `apply(cfg, par, args)` builds the reference `Transformer` on the meta device (`meta_model`),
swaps each block's `attention` / `mlp` for its own modules holding this rank's weight slices
(`shard_block_weights`, from the same seeded full tensors as the reference), gives every parameter still on
meta its full value (`materialise_replicated`), and checks that every local parameter has a Shard spec.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tspbench.config import ModelConfig
from tspbench.model import Transformer, init_full_param
from tspbench.parallel import ParallelConfig, kv_replicas
from tspbench.schemes.comm import Comm, CommLog

DP_PARTS = ("dp_replicate", "dp_shard")
"""HSDP (fsdp_sp): the data-parallel axis split into replicas across shard groups × replicas within one (torchtitan's
dp_replicate × dp_shard); `ApplyArgs.comm("dp")` is the two flattened, so dp's group and ranks are those of a mesh
with one "dp" axis."""


def mesh_shape(par: ParallelConfig) -> tuple[int, ...]:
    sizes = {
        "dp": par.dp,
        "dp_replicate": par.dp // par.dp_shard,
        "dp_shard": par.dp_shard,
        "tp": par.tp_degree,
        "sp": par.sp_degree,
        "tsp": par.degree,
    }
    return tuple(sizes[a] for a in par.spec.mesh)  # the scheme's axes (tspbench/parallel/registry.py)


def build_mesh(par: ParallelConfig, device_type: str) -> DeviceMesh:
    """The rank mesh of one run (world = dp × degree); one process group per axis, and one per flattened
    combination of its axes with more than one rank (`ApplyArgs.flat`: e.g. dp+sp for the gradient sync,
    sp+tp for tp_sp's Megatron-SP norms), made here, once, so that a scheme's apply never creates a group (the
    estimate runs it under a fake-tensor mode, where DeviceMesh cannot build one)."""
    names = par.spec.mesh
    mesh = init_device_mesh(device_type, mesh_shape(par), mesh_dim_names=names)
    live = [a for a, n in zip(names, mesh_shape(par)) if n > 1]
    for k in range(2, len(live) + 1):
        for combo in itertools.combinations(live, k):
            mesh[combo]._flatten("+".join(combo))
    return mesh


def axis_comm(mesh: DeviceMesh, axis: str, log: CommLog) -> Comm:
    return Comm(mesh.get_group(axis), log, axis)


@dataclass
class Shard:
    """How a local parameter relates to reference parameter `name`: split along `dim` over `comm`
    (group-rank order), or replicated (`comm is None`). `grad_sum` is the group over which its gradient
    must be summed after backward because different ranks used it on different tokens (or, for a replicated KV
    head, for different query heads). `fsdp`: the parameter is FSDP2's (a DTensor row-sharded over `comm`); FSDP
    reduce-scatters its gradient, the gradient sync leaves it alone (schemes/fsdp_sp.py)."""

    name: str
    dim: int | None = None
    comm: Comm | None = None
    grad_sum: Comm | None = None
    replicas: int = 1
    """> 1: a KV-head slice replicated over `replicas` consecutive ranks of `comm` (GQA with fewer KV heads than
    the tensor degree, as Megatron): rank r holds slice r // replicas of comm.size // replicas."""
    fsdp: bool = False


def slice_param(
    name: str, full_shape: tuple[int, ...], dim: int, index: int, parts: int, seed: int, dtype: torch.dtype, device
) -> nn.Parameter:
    """This rank's contiguous 1/parts slice of the seeded full parameter."""
    full = init_full_param(name, full_shape, seed, dtype, device)
    # clone, not contiguous(): a row chunk is already contiguous, and a view would keep `full` alive.
    return nn.Parameter(full.chunk(parts, dim)[index].clone())


def materialise_replicated(
    module: Transformer, shards: dict[str, Shard], seed: int, dtype, device, grad_sum: Comm | None
) -> None:
    """Give every parameter still on the meta device (embedding, norms, LM head) its full seeded value;
    they are replicated, with gradients summed over `grad_sum` when ranks see different tokens."""
    made: dict[int, nn.Parameter] = {}  # meta parameter → its value: a tied weight (tie_embeddings) stays one
    for mod_name, mod in module.named_modules():
        for pname, p in list(mod.named_parameters(recurse=False)):
            if id(p) in made:
                setattr(mod, pname, made[id(p)])
                continue
            if not p.is_meta:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            made[id(p)] = nn.Parameter(init_full_param(full, tuple(p.shape), seed, dtype, device))
            setattr(mod, pname, made[id(p)])
            shards[full] = Shard(full, grad_sum=grad_sum)


def meta_model(cfg: ModelConfig, recompute: str) -> tuple[Transformer, dict[str, Shard]]:
    """The reference model on the meta device (no memory), and the empty Shard table the scheme fills."""
    with torch.device("meta"):
        return Transformer(cfg, recompute), {}


def block_rows(
    ranks: torch.Tensor, dims: list[str], axes: tuple[str, ...], block_axis: str, block: int
) -> list[list[int]]:
    """Partition the mesh's global ranks (`ranks`, axes named `dims`) into groups that vary along `axes` and, along
    `block_axis`, over one run of `block` consecutive coordinates; every group in a fixed order."""
    keep = [i for i, a in enumerate(dims) if a not in axes and a != block_axis]
    summed = [dims.index(a) for a in axes]
    # [kept axes..., summed axes..., block axis] → [kept..., runs, summed..., block]: one group per row
    t = ranks.permute(*keep, *summed, dims.index(block_axis)).unflatten(-1, (-1, block)).movedim(-2, len(keep))
    size = block * math.prod(t.shape[len(keep) + 1 : -1])
    return t.reshape(-1, size).tolist()


@dataclass
class ApplyArgs:
    """What every scheme's apply() needs besides the configs."""

    mesh: DeviceMesh
    seq_len: int
    seed: int = 0
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    log: CommLog = field(default_factory=CommLog)
    groups: dict[str, Comm] = field(default_factory=dict)
    """Sub-groups that are not mesh axes (`block_group`), by name; built once, on every rank in the same order."""
    group_specs: dict[str, tuple[tuple[str, ...], str, int]] = field(default_factory=dict)
    """name → (axes, block axis, block size) of each `block_group`, so `sync_group` can add dp to it."""

    def comm(self, axis: str) -> Comm | None:
        """The group of mesh axis `axis`, or None when the mesh has no such axis or it has one rank. "dp" on a mesh
        that splits it (`DP_PARTS`) is the group of both parts."""
        names = self.mesh.mesh_dim_names or ()
        if axis == "dp" and axis not in names and DP_PARTS[1] in names:
            c = self.flat(*DP_PARTS)
            return Comm(c.group, self.log, "dp") if c is not None else None
        if axis not in names:
            return None
        c = axis_comm(self.mesh, axis, self.log)
        return c if c.size > 1 else None

    def flat(self, *axes: str) -> Comm | None:
        """One group over several mesh axes (their ranks flattened, as torchtitan's dp_shard × cp), or the one
        axis that has more than one rank, or None."""
        names = [a for a in axes if self.comm(a) is not None]
        if len(names) <= 1:
            return self.comm(names[0]) if names else None
        flat = self.mesh[tuple(names)]._flatten("+".join(names))  # cached by name: the same group every call
        return Comm(flat.get_group(), self.log, "+".join(names))

    def block_group(self, axes: tuple[str, ...], block_axis: str, block: int) -> Comm | None:
        """The group of ranks that differ only along `axes` and, along `block_axis`, lie in the same run of `block`
        consecutive coordinates (the ranks sharing one replicated KV head, `axes` the token axes its gradient is
        also summed over). Not a mesh axis: every such group is created with dist.new_group, on every rank in the
        same order (a collective), and this rank's is kept in `groups`. None when it has one rank."""
        names = tuple(a for a in axes if self.comm(a) is not None)
        key = "+".join((*names, f"{block_axis}/{block}"))
        if key not in self.groups:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # the mesh's rank table is a real tensor, also under the estimate's fakes
                rows = block_rows(self.mesh.mesh, list(self.mesh.mesh_dim_names or ()), names, block_axis, block)
            me = dist.get_rank()
            for row in rows:
                g = dist.new_group(row)
                if me in row:
                    self.groups[key] = Comm(g, self.log, key)
            self.group_specs[key] = (names, block_axis, block)
        c = self.groups[key]
        return c if c.size > 1 else None

    def sync_group(self, grad_sum: Comm | None) -> Comm | None:
        """The group a gradient summed over `grad_sum` is all-reduced over together with the data-parallel
        average: dp × that mesh axis (or axes), or dp × a `block_group` (dp alone when `grad_sum` is None). Always
        a process group of its own, never one the scheme's collectives use: NCCL runs one communicator's work in
        order on one stream, so a shared group would queue the sync ahead of the next layer's transfers
        (docs/method.md#gpu-review, finding 9)."""
        spec = self.group_specs.get(grad_sum.axis or "") if grad_sum is not None else None
        if spec is None:
            axes = ("dp", *((grad_sum.axis or "").split("+") if grad_sum is not None else ()))
            base = self.flat(*axes)
            rows = self._rows(axes, None, 0)
        else:
            names, block_axis, block = spec
            base = self.block_group(("dp", *names), block_axis, block)
            rows = self._rows(("dp", *names), block_axis, block)
        if base is None:
            return None
        key = f"sync:{base.axis}"
        if key not in self.groups:
            me = dist.get_rank()
            for row in rows:  # every row, on every rank in the same order (dist.new_group is collective)
                g = dist.new_group(row)
                if me in row:
                    self.groups[key] = Comm(g, self.log, base.axis)
        return self.groups[key]

    def _rows(self, axes: tuple[str, ...], block_axis: str | None, block: int) -> list[list[int]]:
        """Every group of ranks that vary along `axes` (dp as the mesh names it) and, when `block_axis` is given,
        within one run of `block` coordinates along it: the partition one such group belongs to."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        dims = list(self.mesh.mesh_dim_names or ())
        expanded = [p for a in axes for p in (DP_PARTS if a == "dp" and "dp" not in dims else (a,))]
        names = [a for a in expanded if a in dims and self.mesh.size(dims.index(a)) > 1]
        if block_axis is None:
            if not names:
                return []
            block_axis, names = names[-1], names[:-1]
            block = self.mesh.size(dims.index(block_axis))
        with unset_fake_temporarily():
            return block_rows(self.mesh.mesh, dims, tuple(names), block_axis, block)

    def need(self, axis: str) -> Comm:
        """The group of an axis the scheme cannot do without (validate_parallel guarantees degree ≥ 2)."""
        c = self.comm(axis)
        assert c is not None, f"mesh axis {axis!r} is missing or has one rank"
        return c


# (reference parameter, shard dim): column-parallel weights split rows (dim 0), row-parallel columns (dim 1).
ATTN_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "wo": 1}
MLP_SPLIT = {"w_gate": 0, "w_up": 0, "w_down": 1}
KV_WEIGHTS = ("wk", "wv")  # rows are KV heads: replicated, not split, when the group outnumbers them


def shard_block_weights(
    module: nn.Module,
    prefix: str,
    split: dict[str, int],
    comm: Comm,
    args: ApplyArgs,
    shards: dict[str, Shard],
    grad_sum: Comm | None = None,
) -> dict[str, nn.Parameter]:
    """This rank's slice (index comm.rank of comm.size) of each weight of a reference submodule.

    GQA with fewer KV heads than ranks (attention: `module.head_dim` set): W_K and W_V are cut into n_kv head
    slices and rank r takes head r // R, R = comm.size / n_kv, replicated over R consecutive ranks (Megatron). Each
    replica back-propagates only its own query heads, so the gradient is summed over those R ranks (and over
    `grad_sum`'s token axes): Shard.grad_sum is then that `ApplyArgs.block_group`."""
    out = {}
    head_dim = getattr(module, "head_dim", None)
    for pname, dim in split.items():
        full_name = f"{prefix}.{pname}"
        shape = tuple(getattr(module, pname).shape)
        n_kv = shape[0] // head_dim if head_dim and pname in KV_WEIGHTS else comm.size
        if n_kv < comm.size:
            reps = kv_replicas(n_kv, comm.size)
            assert comm.axis is not None and n_kv * reps == comm.size, (n_kv, comm.size)
            index, parts = comm.rank // reps, n_kv
            axes = tuple(grad_sum.axis.split("+")) if grad_sum is not None and grad_sum.axis else ()
            shard = Shard(full_name, dim, comm, args.block_group(axes, comm.axis, reps), reps)
        else:
            index, parts, shard = comm.rank, comm.size, Shard(full_name, dim, comm, grad_sum)
        out[pname] = slice_param(full_name, shape, dim, index, parts, args.seed, args.dtype, args.device)
        shards[full_name] = shard
    return out


def check_shards(module: nn.Module, shards: dict[str, Shard]) -> dict[str, Shard]:
    """Every local parameter must have a shard spec (keyed by its name, which equals the reference name)."""
    out = {}
    for name, _ in module.named_parameters():
        if name in shards:
            out[name] = shards[name]
        else:
            raise KeyError(f"no shard spec for local parameter {name}")
    return out


def replicated_weights(module: nn.Module, names) -> dict[str, nn.Parameter]:
    """The reference submodule's (meta) parameters, to be moved into a scheme module unchanged;
    `materialise_replicated` later gives them their full seeded values."""
    return {n: getattr(module, n) for n in names}

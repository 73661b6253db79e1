"""How a scheme builds its rank's part of the model: the process-group mesh, "build full, then shard"
weight slicing, and the Shard spec that says how each local parameter relates to the reference.

A scheme's `apply(cfg, par, args)` builds the reference `Transformer` on the meta device (`meta_model`),
swaps each block's `attention` / `mlp` for its own modules holding this rank's weight slices
(`shard_block_weights`, from the same seeded full tensors as the reference), gives every parameter still on
meta its full value (`materialise_replicated`), and checks that every local parameter has a Shard spec.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tspbench.config import ModelConfig, ParallelConfig
from tspbench.model import Transformer, init_full_param
from tspbench.schemes.comm import Comm, CommLog

# Mesh axes per scheme, outermost first. The tensor axis is innermost (fastest-varying ranks), as in
# Megatron, so a tensor group stays inside one node.
MESH_AXES = {
    "single": ("dp",),
    "tp": ("dp", "tp"),
    "tp_msp": ("dp", "tp"),
    "sp": ("dp", "sp"),
    "tp_sp": ("dp", "sp", "tp"),
    "tsp": ("dp", "tsp"),
}


def mesh_shape(par: ParallelConfig) -> tuple[int, ...]:
    sizes = {"dp": par.dp, "tp": par.tp_degree, "sp": par.sp_degree, "tsp": par.degree}
    return tuple(sizes[a] for a in MESH_AXES[par.scheme])


def build_mesh(par: ParallelConfig, device_type: str) -> DeviceMesh:
    """The rank mesh of one run (world = dp × degree); one process group per axis, and one per flattened
    combination of its axes with more than one rank (`ApplyArgs.flat`: e.g. dp+sp for the gradient sync,
    sp+tp for tp_sp's Megatron-SP norms), made here, once, so that a scheme's apply never creates a group (the
    estimate runs it under a fake-tensor mode, where DeviceMesh cannot build one)."""
    names = MESH_AXES[par.scheme]
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
    must be summed after backward because different ranks used it on different tokens."""

    name: str
    dim: int | None = None
    comm: Comm | None = None
    grad_sum: Comm | None = None


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
    for mod_name, mod in module.named_modules():
        for pname, p in list(mod.named_parameters(recurse=False)):
            if not p.is_meta:
                continue
            full = f"{mod_name}.{pname}" if mod_name else pname
            setattr(mod, pname, nn.Parameter(init_full_param(full, tuple(p.shape), seed, dtype, device)))
            shards[full] = Shard(full, grad_sum=grad_sum)


def meta_model(cfg: ModelConfig, recompute: str) -> tuple[Transformer, dict[str, Shard]]:
    """The reference model on the meta device (no memory), and the empty Shard table the scheme fills."""
    with torch.device("meta"):
        return Transformer(cfg, recompute), {}


@dataclass
class ApplyArgs:
    """What every scheme's apply() needs besides the configs."""

    mesh: DeviceMesh
    seq_len: int
    seed: int = 0
    dtype: torch.dtype = torch.float32
    device: torch.device | str = "cpu"
    log: CommLog = field(default_factory=CommLog)

    def comm(self, axis: str) -> Comm | None:
        """The group of mesh axis `axis`, or None when the mesh has no such axis or it has one rank."""
        if axis not in (self.mesh.mesh_dim_names or ()):
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

    def need(self, axis: str) -> Comm:
        """The group of an axis the scheme cannot do without (validate_parallel guarantees degree ≥ 2)."""
        c = self.comm(axis)
        assert c is not None, f"mesh axis {axis!r} is missing or has one rank"
        return c


# (reference parameter, shard dim): column-parallel weights split rows (dim 0), row-parallel columns (dim 1).
ATTN_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "wo": 1}
MLP_SPLIT = {"w_gate": 0, "w_up": 0, "w_down": 1}


def shard_block_weights(
    module: nn.Module,
    prefix: str,
    split: dict[str, int],
    comm: Comm,
    args: ApplyArgs,
    shards: dict[str, Shard],
    grad_sum: Comm | None = None,
) -> dict[str, nn.Parameter]:
    """This rank's slice (index comm.rank of comm.size) of each weight of a reference submodule."""
    out = {}
    for pname, dim in split.items():
        full_name = f"{prefix}.{pname}"
        shape = tuple(getattr(module, pname).shape)
        out[pname] = slice_param(full_name, shape, dim, comm.rank, comm.size, args.seed, args.dtype, args.device)
        shards[full_name] = Shard(full_name, dim, comm, grad_sum)
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

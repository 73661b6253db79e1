"""Column/row-parallel attention and gated MLP over a tensor group (Megatron; Shoeybi et al. 2019), shared by
tp, tp_msp and tp_sp. Each module holds this rank's head / channel slice.

Entry: the column-parallel projections sharing one input (Q, K, V; gate and up) are one `column_parallel` call,
Megatron's `LinearWithGradAccumulationAndAsyncCommunication` (megatron/core/tensor_parallel/layers.py) in its
default schedule (no --tp-comm-overlap; docs/method.md#choice-overlap):
    Megatron-SP (tp_msp; tp_sp's tensor axis)  forward: all-gather the rank's piece of the sequence, the GEMMs; saved
                for backward: the piece, not the gathered [S, h]. Backward: the piece re-gathered asynchronously
                while the dgrad GEMMs run, waited; dgrad reduce-scattered asynchronously while the wgrad GEMMs
                run, waited.
    plain (tp; tp_sp msp=false)  forward: the GEMMs on the replicated input (Megatron's f is folded in: identity
                forward). Backward: the dgrad GEMMs, their all-reduce posted before the wgrad GEMMs and waited after.
Exit: the row-parallel GEMM, then `exit` (tp: g, the all-reduce; Megatron-SP: the reduce-scatter back to the
pieces), synchronous as Megatron's RowParallelLinear. Serving decodes with f and g on the replicated token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig
from tspbench.model import CoreAttention, LayerKV, causal_attention, linear, project_qkv, rope_heads, silu_mul, swiglu
from tspbench.schemes.comm import Comm, Pending, copy_to_region, reduce_from_region, reduce_scatter_to_sequence
from tspbench.schemes.ops.decode import Decodable, decode_attend


# ---------------------------------------------------------------------------------------------- column-parallel
def _tokens(t: torch.Tensor, seq_first: bool) -> torch.Tensor:
    """[B, S, k] → [tokens, k] in the buffer's order: [S·B] for a sequence-first (all-gathered) buffer, else [B·S]
    (a view when the tensor is stored in that order)."""
    return (t.transpose(0, 1) if seq_first else t).reshape(-1, t.shape[-1])


def _reduce_dgrad(dx: torch.Tensor, comm: Comm, sequence_parallel: bool, label: str) -> Pending:
    """Post the reduction of the dgrad (contiguous, sequence-first under Megatron-SP): its reduce-scatter to the
    pieces (Megatron-SP), else its all-reduce (Megatron's f)."""
    if sequence_parallel:
        return comm.start_reduce_scatter(dx, label=f"{label}:reduce_scatter")
    return comm.start_all_reduce(dx, label=f"{label}:all_reduce")


class _ColumnParallel(torch.autograd.Function):
    """Column-parallel GEMMs of one input x: [B, S_in, h] → one [B, S, out_i] per weight (module docstring)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, sequence_parallel: bool, name: str, *weights):
        ctx.comm, ctx.sp, ctx.name, ctx.tag = comm, sequence_parallel, name, comm.log.tag
        total = comm.all_gather(x, dim=1) if sequence_parallel else x  # [B, S, h] (a view of [S, B, h] at B > 1)
        ctx.save_for_backward(x, *weights)  # Megatron: the piece, re-gathered in backward
        return tuple(linear(total, w) for w in weights)

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        comm, sp, label = ctx.comm, ctx.sp, f"tp:{ctx.tag}:{ctx.name}"
        with comm.log.scope(ctx.tag, backward=True):
            if sp:  # the piece's re-gather in flight during the dgrad GEMMs
                gather = comm.start_all_gather(x.movedim(1, 0), label=f"{label}:all_gather")
            comm.log.event("compute", f"{label}:dgrad")
            seq_first = sp  # the gathered buffer is [S, B, h]: work in its token order
            gs = [_tokens(g, seq_first) for g in grads]
            dx = gs[0] @ weights[0]
            for g, w in zip(gs[1:], weights[1:]):
                torch.addmm(dx, g, w, out=dx)  # in place (addmm_ is this); the FLOP counter sees aten.addmm
            total = _tokens(gather.wait(), False) if sp else _tokens(x, False)
            reduction = _reduce_dgrad(dx, comm, sp, label)  # in flight during the wgrad GEMMs
            comm.log.event("compute", f"{label}:wgrad")
            dws = [g.t() @ total for g in gs]
            del gs, total
            dx = reduction.wait()
        b = x.shape[0]
        dx = dx.unflatten(0, (-1, b)).transpose(0, 1) if sp else dx.view_as(x)
        return (dx, None, None, None, *dws)


def column_parallel(
    x: torch.Tensor, weights: tuple[torch.Tensor, ...], comm: Comm | None, sequence_parallel: bool, name: str
) -> tuple[torch.Tensor, ...]:
    """x·W_iᵀ for each weight (module docstring); `comm` None (a one-rank tensor group): the plain GEMMs."""
    if comm is None:
        return tuple(linear(x, w) for w in weights)
    return _ColumnParallel.apply(x, comm, sequence_parallel, name, *weights)


# ---------------------------------------------------------------------------------------------- modules
class TPAttention(nn.Module, Decodable, CoreAttention):
    """Heads split over the tensor group. tp_msp and tp_sp subclass this and change only `sequence_parallel`,
    `gemm_positions` and `exit`. Serving (schemes/ops/decode.py): `kv` caches this rank's heads during the
    prefill; with `decoding` set, one replicated token attends to the cache (Megatron's f and g)."""

    kv: LayerKV | None = None
    sequence_parallel = False
    """Megatron-SP: the input is this rank's piece of the sequence, all-gathered by the column-parallel entry."""

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm | None, cfg: ModelConfig):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.head_dim, self.theta = comm, cfg.head_dim, cfg.rope  # base and scaling

    seq_comm: Comm | None = None
    """The group the cache's tokens are sharded over (tp_sp: sp); None: this rank caches every token."""

    def gemm_positions(self, x, positions):
        """Global positions of the tokens the projections run on (Megatron-SP: the gathered ones)."""
        return positions

    def exit(self, y):
        return reduce_from_region(y, self.comm)  # g: all-reduce fwd, identity bwd

    def attend(self, q, k, v):
        return self.core(causal_attention, q, k, v, 0)  # full sequence: plain causal

    def attend_project(self, q, k, v):
        """Attention and the row-parallel W_O: [B, S, n_h/T·d] → this rank's partial sum [B, S, h]."""
        return F.linear(self.attend(q, k, v).transpose(1, 2).flatten(2), self.wo)

    def forward(self, x, positions):
        if self.decoding:
            return self.decode(x, positions)
        positions = self.gemm_positions(x, positions)
        qkv = column_parallel(x, (self.wq, self.wk, self.wv), self.comm, self.sequence_parallel, "attention")
        q, k, v = rope_heads(qkv[0], qkv[1], qkv[2], positions, self.head_dim, self.theta)  # [B, heads/T, S, d]
        del qkv  # the un-roped projections are not kept beside the roped ones (forward without grad: freed)
        if self.kv is not None:  # prefill: cache what this rank computed
            self.kv.append(k, v)
        return self.exit(self.attend_project(q, k, v))  # the exit sums the head shards' partial sums

    def decode(self, x, positions):
        """x: [B, 1, h], the same on every rank; positions: [position]."""
        x = copy_to_region(x, self.comm)
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        o = decode_attend(q, k, v, self.kv, self.seq_comm, self.decode_state.position)  # [B, n_h/T, 1, d]
        y = F.linear(o.transpose(1, 2).flatten(2), self.wo)
        return reduce_from_region(y, self.comm)


class TPMLP(nn.Module, Decodable):
    sequence_parallel = False

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm | None):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.comm = comm

    def exit(self, y):
        return reduce_from_region(y, self.comm)

    def forward(self, x):
        if self.decoding:  # one replicated token: f and g
            y = swiglu(copy_to_region(x, self.comm), self.w_gate, self.w_up, self.w_down)
            return reduce_from_region(y, self.comm)
        gate, up = column_parallel(x, (self.w_gate, self.w_up), self.comm, self.sequence_parallel, "mlp")
        return self.exit(linear(silu_mul(gate, up), self.w_down))  # partial over F·h/T


class SeqParallelMLP(TPMLP):
    """Megatron-SP's MLP (tp_msp; tp_sp's tensor axis): the sequence pieces all-gathered in (by the column-parallel
    entry), the row-parallel partial sums reduce-scattered out (dim 1 of [B, S_loc, h]). Decoding one replicated
    token: plain TP."""

    comm: Comm  # Megatron-SP needs a tensor group of T ≥ 2 ranks
    sequence_parallel = True

    def exit(self, y):
        return reduce_scatter_to_sequence(y, self.comm, dim=1)

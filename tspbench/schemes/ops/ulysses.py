"""DeepSpeed-Ulysses attention for token-sharded ranks (`sp_variant=ulysses` of sp and fsdp_sp, and of tp_sp's Σ axis
on its n/T heads; docs/method.md#ulysses).

Jacobs et al. 2023 (arXiv:2309.14509), DeepSpeed `deepspeed/sequence/layer.py` DistributedAttention: instead of
moving K/V along the sequence, exchange heads. Every rank holds all heads of S/Σ tokens; all-to-alls turn that into
n/Σ heads of all S tokens, attention runs unchanged (plain causal attention over the whole sequence, each head
independent), and an all-to-all turns the output back into token shards:

    in    Q, K and V each exchanged (one all-to-all per tensor of Σ blocks of S/Σ tokens × heads/Σ) → heads/Σ of all
          S tokens in rank order → un-zigzag (SeqLayout)
    core  causal attention of the n_q/Σ query heads against their n_kv/Σ K/V heads (GQA groups stay whole:
          query group j uses exactly K/V group j because both are split into Σ contiguous blocks)
    out   re-zigzag to rank order, all-to-all (rank j gets its S/Σ tokens of my heads), W_O

The schedule is DeepSpeed's communication overlap (`DistributedAttention(..., sp_stream=...)`, DeepSpeed ≥ 0.14.5,
deepspeedai/DeepSpeed pull request 5691, with split Q, K, V projections as Megatron-DeepSpeed's
split_qkv_overlap_comm branch runs it; docs/method.md#ulysses):
    forward   Q projected and its exchange posted, then K projected (Q's exchange in flight) and its exchange
              posted, then V projected and its exchange posted; all three waited before the kernel (V's exposed);
              O's exchange synchronous.
    backward  W_O's dgrad GEMM, O's gradient exchange posted before W_O's wgrad GEMM and waited after it; the
              kernel's dV, dK, dQ exchanges posted together, dV waited first, V's projection backward runs while
              dK and dQ travel, then K's while dQ does (`_PostExchange` waits where its gradient is consumed, so
              autograd's order, latest-created node first, is the schedule).
tp_sp's column-parallel entry computes Q, K and V in one Function (Megatron's fused QKV), so there the three
exchanges are posted back to back with no projection between them and waited before it runs: only the O side
overlaps. Needs n_q and n_kv divisible by Σ (tp_sp: by T·Σ; config.validate_parallel). Communication per layer,
received per rank (N = B·S): forward (N/Σ)·(h + 2h/g)·(Σ−1)/Σ in + (N/Σ)·h·(Σ−1)/Σ out = (N/Σ)·(2h + 2h/g)·(Σ−1)/Σ,
in four all-to-alls (Q, K, V, O); backward the inverse exchanges of the gradients, the same.

Recompute=selective re-runs only the kernel (with the un-/re-zigzag): its inputs, the head-sharded Q, K, V, are
the same bytes as the local ones the projections make, so keeping them costs what the all-gather variant keeps
for Q and the local K/V, and the all-to-alls are not replayed. Decode reuses the token-sharded K/V cache and
the sp decode merge (schemes/ops/decode.py): one new token has no sequence to exchange.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tspbench.config import Rope
from tspbench.model import apply_rope, causal_attention, linear, rope_cos_sin
from tspbench.schemes.comm import Comm, CommLog, Pending
from tspbench.schemes.ops.layout import SeqLayout

Core = Callable[..., torch.Tensor]


def _phase() -> str:
    """fwd, or bwd while autograd runs the backward (a recompute's forward included)."""
    return "bwd" if torch._C._current_graph_task_id() != -1 else "fwd"


class _Box:
    """One tensor's exchange: the forward all-to-all, then its gradient's (posted by `_WaitExchange.backward`); each
    dropped once waited."""

    fwd: Pending
    bwd: Pending | None


class _PostExchange(torch.autograd.Function):
    """Forward: post the all-to-all of `chunks` ([Σ, …]: block j to rank j); the result is valid after
    `_WaitExchange`. Backward: wait for the gradient's exchange `_WaitExchange.backward` posted (here, where the
    gradient is consumed: the projection backward that follows runs after this wait)."""

    @staticmethod
    def forward(ctx, chunks, comm: Comm, box: _Box, label: str):
        ctx.box = box
        box.fwd = comm.start_all_to_all(chunks, label=label)
        return box.fwd.result

    @staticmethod
    def backward(ctx, g):
        g, ctx.box.bwd = ctx.box.bwd.wait(), None  # the graph keeps the box: drop the buffer's reference
        return g, None, None, None


class _WaitExchange(torch.autograd.Function):
    """Forward: wait for the exchange `_PostExchange` posted. Backward: post the gradient's exchange (the all-to-all
    with this layout is its own inverse) and hand its not-yet-valid result on to `_PostExchange.backward`."""

    @staticmethod
    def forward(ctx, buf, comm: Comm, box: _Box, label: str):
        ctx.comm, ctx.box, ctx.label, ctx.tag = comm, box, label, comm.log.tag
        box.fwd.wait()
        del box.fwd  # the graph keeps the box: drop the received buffer's reference (it is not saved)
        return buf.view_as(buf)

    @staticmethod
    def backward(ctx, g):
        with ctx.comm.log.scope(ctx.tag, backward=True):
            ctx.box.bwd = ctx.comm.start_all_to_all(g.contiguous(), label=ctx.label)
        return ctx.box.bwd.result, None, None, None


class _Mark(torch.autograd.Function):
    """Identity; its backward records a compute mark in the issue order (the projection backward starts)."""

    @staticmethod
    def forward(ctx, x, log: CommLog, label: str):
        ctx.log, ctx.label = log, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.log.event("compute", ctx.label)
        return g, None, None


class _Exchange:
    """One tensor's exchange to head shards, posted at construction: t [B, heads, S/Σ, d] (local zigzag order);
    `wait()` → [S, B, heads/Σ, d] (rank order)."""

    def __init__(self, t: torch.Tensor, comm: Comm, name: str):
        p, tag = comm.size, comm.log.tag
        self.comm, self.box, self.name = comm, _Box(), name
        self.label = f"ulysses:{tag}:{_phase()}:{name}"
        chunks = t.permute(2, 0, 1, 3).unflatten(2, (p, -1)).movedim(2, 0).contiguous()  # [Σ, S/Σ, B, heads/Σ, d]
        self.buf = _PostExchange.apply(chunks, comm, self.box, self.label)
        self.grad_label = f"ulysses:{tag}:bwd:d{name}"

    def wait(self) -> torch.Tensor:
        return _WaitExchange.apply(self.buf, self.comm, self.box, self.grad_label).flatten(0, 1)


class _ExchangeOutProject(torch.autograd.Function):
    """O's exchange back to token shards and W_O: o [S, B, n_q/Σ, d] (rank order) → y = O_tokens·W_Oᵀ [B, S/Σ, out].
    Backward (DeepSpeed: "the computation of d o_weight can overlap with the communication of d o_input"): W_O's
    dgrad, its exchange posted, W_O's wgrad, the exchange waited."""

    @staticmethod
    def forward(ctx, o, wo, comm: Comm, batch: int):
        p, tag = comm.size, comm.log.tag
        ctx.comm, ctx.tag, ctx.p = comm, tag, p
        recv = comm.start_all_to_all(o.unflatten(0, (p, -1)).contiguous(), label=f"ulysses:{tag}:{_phase()}:o").wait()
        s_loc, heads, d = recv.shape[1], recv.shape[3], recv.shape[4]
        o_tok = recv.permute(2, 1, 0, 3, 4).reshape(batch, s_loc, p * heads * d)  # block j: head group j
        del recv
        ctx.save_for_backward(o_tok, wo)
        ctx.shape = (batch, s_loc, p, heads, d)
        return F.linear(o_tok, wo)

    @staticmethod
    def backward(ctx, dy):
        o_tok, wo = ctx.saved_tensors
        comm, log, (b, s_loc, p, heads, d) = ctx.comm, ctx.comm.log, ctx.shape
        with log.scope(ctx.tag, backward=True):
            log.event("compute", f"ulysses:{ctx.tag}:bwd:wo_dgrad")
            d_tok = dy @ wo  # [B, S/Σ, n_q·d]
            chunks = d_tok.view(b, s_loc, p, heads, d).permute(2, 1, 0, 3, 4).contiguous()
            del d_tok
            exchange = comm.start_all_to_all(chunks, label=f"ulysses:{ctx.tag}:bwd:do")
            log.event("compute", f"ulysses:{ctx.tag}:bwd:wo_wgrad")
            dwo = dy.flatten(0, 1).t() @ o_tok.flatten(0, 1)
            do = exchange.wait().flatten(0, 1)  # [S, B, n_q/Σ, d], rank order
        return do, dwo, None, None


def _marked_linear(x: torch.Tensor, w: torch.Tensor, log: CommLog, label: str) -> torch.Tensor:
    return _Mark.apply(linear(x, w), log, label)


def ulysses_project_attend(
    x: torch.Tensor,
    w: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    positions: torch.Tensor,
    head_dim: int,
    theta: float | Rope,
    comm: Comm,
    layout: SeqLayout,
    core: Core = lambda fn, *args: fn(*args),
) -> torch.Tensor:
    """sp / fsdp_sp: the whole attention sub-block, x [B, S/Σ, h] (zigzag shard, `positions` its global ones) →
    W_O's output [B, S/Σ, h], with the projections interleaved with the exchanges (module docstring). The same maths
    as model.project_qkv + attention + W_O."""
    wq, wk, wv, wo = w
    log, tag, ph = comm.log, comm.log.tag, _phase()
    cos, sin = rope_cos_sin(positions, head_dim, theta, x.dtype)
    marks = {name: f"ulysses:{tag}:bwd:proj_{name}" for name in "qkv"}
    q = apply_rope(_marked_linear(x, wq, log, marks["q"]).unflatten(-1, (-1, head_dim)), cos, sin).transpose(1, 2)
    eq = _Exchange(q, comm, "q")
    log.event("compute", f"ulysses:{tag}:{ph}:proj_k")
    k = apply_rope(_marked_linear(x, wk, log, marks["k"]).unflatten(-1, (-1, head_dim)), cos, sin).transpose(1, 2)
    ek = _Exchange(k, comm, "k")
    log.event("compute", f"ulysses:{tag}:{ph}:proj_v")
    v = _marked_linear(x, wv, log, marks["v"]).unflatten(-1, (-1, head_dim)).transpose(1, 2)
    ev = _Exchange(v, comm, "v")
    del q, k, v
    return _attend_out([e.wait() for e in (eq, ek, ev)], wo, comm, layout, core, x.shape[0])


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    wo: torch.Tensor,
    comm: Comm,
    layout: SeqLayout,
    core: Core = lambda fn, *args: fn(*args),
) -> torch.Tensor:
    """q: [B, n_q, S/Σ, d], k, v: [B, n_kv, S/Σ, d] in local zigzag order (projected already: tp_sp's fused
    column-parallel entry, a serving prefill) → W_O's output [B, S/Σ, out]. The three exchanges are posted back to
    back. `core(fn, *args)` runs the kernel part (checkpointed under recompute=selective)."""
    exchanges = [_Exchange(t, comm, name) for t, name in ((q, "q"), (k, "k"), (v, "v"))]
    return _attend_out([e.wait() for e in exchanges], wo, comm, layout, core, q.shape[0])


def _attend_out(heads: list[torch.Tensor], wo, comm: Comm, layout: SeqLayout, core: Core, batch: int):
    o = core(_head_attention, *heads, layout)  # [S, B, n_q/Σ, d], rank order
    return _ExchangeOutProject.apply(o, wo, comm, batch)


def _head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout) -> torch.Tensor:
    """Whole-sequence causal attention of this rank's heads. q, k, v: [S, B, heads/Σ, d] in rank (zigzag) order →
    [S, B, n_q/Σ, d] in rank order."""
    q, k, v = (layout.unshard(t, dim=0).permute(1, 2, 0, 3) for t in (q, k, v))  # [B, heads/Σ, S, d] views
    o = causal_attention(q, k, v, 0)
    return layout.reshard(o.permute(2, 0, 1, 3), dim=0)

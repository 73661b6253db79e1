"""tsp — Tensor and Sequence Parallelism folded onto one axis of D ranks (Zyphra, arXiv 2604.26294).

Each rank p holds 1/D of every attention and MLP weight (owner shard p: heads p·n_h/D … and their n_kv/D
KV heads; intermediate channels p·F·h/D …) AND 1/D of the tokens (zigzag: chunks p and 2D−1−p of 2D).
Weights move at run time, activations stay put (docs/method.md#tsp).

Attention (docs/method.md#tsp-attention), rank p, local tokens X_p:
    for r in 0 … D−1:   W_r = broadcast(packed W_Q,K,V,O shard, src=r)
                        Q = X_p·W_Qrᵀ;  K, V = all_gather_seq(X_p·W_Krᵀ, X_p·W_Vrᵀ)  (shard r's heads, all S tokens)
                        Y_p += causal_attn(Q, K, V)·W_Orᵀ                           (local sum: no all-reduce)
Gated MLP (docs/method.md#tsp-mlp): shards travel a ring (send to p+1, receive from p−1), double-buffered so shard
t+1 is in flight while shard t computes; Y_p += SwiGLU_t(X_p) accumulates locally.

Backward (docs/method.md#choice-backward, our design): attention re-broadcasts each shard and re-gathers its K/V
(each owner step is recomputed, so nothing of size S is kept per shard); each shard's weight gradient is reduced to
its owner (the dual of the broadcast) and dK/dV are reduce-scattered back to the token owners (the dual of the
all-gather). The MLP re-circulates the weights and a gradient accumulator travels behind each shard, picking
up every rank's partial dW and arriving summed at the owner after D−1 hops (a ring reduce-scatter). dX
stays local. Norms, embedding and LM head are replicated and run on local tokens (docs/method.md#choice-embedding),
so their gradients are all-reduced over the group; with vocab=ring the embedding and LM head are sharded 1/D and
travel the same weight ring as the MLP (schemes/ops/vocab_ring.py, docs/method.md#choice-embedding).

Communication per layer per rank, forward (elements received; W = (2+2/g+3F)·h² weights, K = 2·B·S·h/g):
    D broadcasts of (2+2/g)·h²/D  +  D−1 ring hops of 3F·h²/D   → W·(D−1)/D
    D all-gathers of 2·B·S·h/(g·D)                              → K·(D−1)/D
backward: the broadcasts and all-gathers again (recompute), D reduces (attention dW), D reduce-scatters
(dK/dV), D−1 weight hops + D−1 gradient hops (MLP): (2W + 2K)·(D−1)/D, so 3W + 3K per layer in forward +
backward. (docs/method.md#communication's 3W + 2K assumes the gathered K/V are kept from the forward instead of
re-gathered; docs/method.md#choice-backward's default, followed here, re-gathers them.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tspbench.config import ModelConfig, ParallelConfig
from tspbench.model import LayerKV, project_qkv, swiglu
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm, broadcast_from_owner, gather_from_sequence, reduce_from_region
from tspbench.schemes.ops.decode import Decodable, decode_attend
from tspbench.schemes.ops.layout import SeqLayout, attend_shard
from tspbench.schemes.ops.ring import pack, ring_backward, ring_forward, unpack
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    MLP_SPLIT,
    ApplyArgs,
    check_shards,
    materialise_replicated,
    meta_model,
    shard_block_weights,
)
from tspbench.schemes.ops.vocab_ring import ring_vocab


# ---- attention: broadcast loop + K/V all-gather -------------------------------------------------------
class TSPAttention(nn.Module, Decodable):
    """Serving (schemes/ops/decode.py): the prefill caches each owner step's K/V of the local tokens, so a rank
    holds every head of its 1/D of the tokens; decode keeps the weights in place, all-gathers the new
    token's queries over heads and merges the ranks' partial attentions back onto the head owners."""

    kv: LayerKV | None = None

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm, layout: SeqLayout, cfg: ModelConfig):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.layout = comm, layout
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta
        self._prefill_kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def owner_step(self, x: torch.Tensor, own: torch.Tensor, r: int, positions: torch.Tensor, tag: str) -> torch.Tensor:
        """Owner r's contribution to this rank's output. x: [B, S/D, h] → [B, S/D, h]. `tag` keeps the
        layer label on collectives replayed by the recompute in backward."""
        shapes = [self.wq.shape, self.wk.shape, self.wv.shape, self.wo.shape]
        with self.comm.log.scope(tag):
            return self._owner_step(x, own, r, positions, shapes)

    def _owner_step(self, x, own, r, positions, shapes):
        wq, wk, wv, wo = unpack(broadcast_from_owner(own, self.comm, src=r), shapes)
        q, k, v = project_qkv(x, wq, wk, wv, positions, self.head_dim, self.theta)  # [B, heads_r, S/D, d]
        if self.kv is not None:  # prefill: owner r's heads of my tokens
            self._prefill_kv.append((k.detach(), v.detach()))
        n_kv = k.shape[1]
        kv = gather_from_sequence(torch.cat([k, v], dim=1), self.comm, dim=2)  # [B, 2·n_kv/D, S, d]
        kv = self.layout.unshard(kv, dim=2)  # zigzag → logical order
        o = attend_shard(q, kv[:, :n_kv], kv[:, n_kv:], self.layout)  # [B, n_h/D, S/D, d]
        return F.linear(o.transpose(1, 2).flatten(2), wo)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.decoding:
            return self.decode(x, positions)
        own = pack([self.wq, self.wk, self.wv, self.wo])
        y, tag = torch.zeros_like(x), self.comm.log.tag
        for r in range(self.comm.size):
            if torch.is_grad_enabled():
                # Recompute in backward: re-broadcast shard r and re-gather its K/V rather than keep D
                # shards and D full-sequence K/V alive until backward (that would undo the 1/D saving).
                y = y + checkpoint(self.owner_step, x, own, r, positions, tag, use_reentrant=False)
            else:
                y = y + self.owner_step(x, own, r, positions, tag)
        if self.kv is not None:  # every head of my tokens, in owner (= head) order
            ks, vs = zip(*self._prefill_kv)
            self.kv.append(torch.cat(ks, dim=1), torch.cat(vs, dim=1))
            self._prefill_kv.clear()
        return y

    def decode(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, 1, h], the same on every rank. My weight shard stays here; the token's q, k, v of my heads
        are all-gathered over heads, the owner of `position` caches k, v, and the partial attentions over
        each rank's cached tokens merge onto the head owners, whose W_O partial sums are all-reduced."""
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        q, k, v = (self.comm.all_gather(t.contiguous(), dim=1) for t in (q, k, v))  # every head, [B, ·, 1, d]
        o = decode_attend(q, k, v, self.kv, self.comm, self.decode_state.position, scatter_heads=True)  # my heads
        return reduce_from_region(F.linear(o.transpose(1, 2).flatten(2), self.wo), self.comm)


# ---- gated MLP: weight ring, double-buffered --------------------------------------------------------
class _RingMLP(torch.autograd.Function):
    """Y = Σ_t SwiGLU(X; shard (p−t) mod D), shards hopping p → p+1 while the current one computes.
    Backward re-circulates the shards; a gradient accumulator follows each one and lands on its owner
    (schemes/ops/ring.py)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, comm: Comm):
        ctx.comm, ctx.tag = comm, comm.log.tag
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        shapes = [w_gate.shape, w_up.shape, w_down.shape]
        y = torch.zeros_like(x)

        def step(owner, buf):
            y.add_(swiglu(x, *unpack(buf, shapes)))  # partial over this shard's F·h/D channels

        ring_forward(comm, pack([w_gate, w_up, w_down]), step)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w_gate, w_up, w_down = ctx.saved_tensors
        comm, shapes = ctx.comm, [w_gate.shape, w_up.shape, w_down.shape]
        dx = torch.zeros_like(x)

        def partial_grad(owner, buf):
            dx_t, dw_t = _swiglu_grads(x, unpack(buf, shapes), dy)
            dx.add_(dx_t)
            return pack(dw_t)  # this rank's partial dW for the shard

        with comm.log.scope(ctx.tag, backward=True):
            own_grad = ring_backward(comm, pack([w_gate, w_up, w_down]).detach(), partial_grad)
        dwg, dwu, dwd = unpack(own_grad, shapes)
        return dx, dwg, dwu, dwd, None


def _swiglu_grads(x, ws, dy):
    """d/dx and d/dW of SwiGLU for one shard (recomputing its intermediate: nothing was stored)."""
    with torch.enable_grad():
        xg = x.detach().requires_grad_()
        wg = [w.detach().requires_grad_() for w in ws]
        out = swiglu(xg, *wg)
        grads = torch.autograd.grad(out, [xg, *wg], dy)
    return grads[0], list(grads[1:])


class TSPMLP(nn.Module, Decodable):
    def __init__(self, w: dict[str, nn.Parameter], comm: Comm):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.decoding
        ):  # one replicated token: my channels in place, partial sums all-reduced (docs/method.md#choice-decode)
            return reduce_from_region(swiglu(x, self.w_gate, self.w_up, self.w_down), self.comm)
        return _RingMLP.apply(x, self.w_gate, self.w_up, self.w_down, self.comm)


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.need("tsp")
    layout = SeqLayout(args.seq_len, comm.size, comm.rank, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    for i, block in enumerate(module.blocks):
        block.attention = TSPAttention(
            shard_block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, comm, args, shards),
            comm,
            layout,
            cfg,
        )
        block.mlp = TSPMLP(shard_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, comm, args, shards), comm)
    vocab = (
        ring_vocab(module, cfg, comm, args, shards) if par.vocab == "ring" else None
    )  # docs/method.md#choice-embedding
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=comm)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=comm, vocab=vocab)

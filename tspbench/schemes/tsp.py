"""tsp — Tensor and Sequence Parallelism folded onto one axis of D ranks (Zyphra, arXiv 2604.26294).

Each rank p holds 1/D of every attention and MLP weight (owner shard p: heads p·n_h/D … and their n_kv/D
KV heads; intermediate channels p·F·h/D …) AND 1/D of the tokens (zigzag: chunks p and 2D−1−p of 2D).
Weights move at run time, activations stay put (docs/method.md#tsp).

Attention (docs/method.md#tsp-attention, schemes/ops/owner_attention.py), rank p, local tokens X_p:
    for r in 0 … D−1:   W_r = broadcast(packed W_Q,K,V,O shard, src=r)
                        Q = X_p·W_Qrᵀ;  K, V = all_gather_seq(X_p·W_Krᵀ, X_p·W_Vrᵀ) per head bucket (next in flight)
                        Y_p += causal_attn(Q, K, V)·W_Orᵀ                           (local sum: no all-reduce)
    pipelined across owners: owner r+1's shard is awaited and projected, and its first K/V bucket's all-gather
    posted, before owner r's attention runs (r+2's broadcast then in flight: three receive buffers).
Gated MLP (docs/method.md#tsp-mlp), `mlp_exchange`: ring (default: shards travel p → p+1 into two persistent
buffers, the hop of shard t+1 posted before shard t computes), biring (half of each shard's channels each way round
the ring, both hops posted before the step's two halves compute) or broadcast (owner r's shard broadcast, r+1's in
flight while r computes); Y_p += SwiGLU(X_p; shard or half) accumulates locally (schemes/ops/ring.py).

Backward (docs/method.md#tsp-backward): attention re-broadcasts each shard and re-gathers its K/V (communication
only: q, the local k, v, the output and its log-sum-exp were kept, so nothing is recomputed; owner r+1's first
bucket posted before owner r's attention backward), or with regather_kv=false uses the K/V the forward (or the
full-recompute replay) gathered (docs/method.md#choice-backward); each shard's weight gradient is reduced to its
owner (the dual of the broadcast) and dK/dV are reduce-scattered back to the token owners (the dual of the
all-gather), both asynchronous. The MLP keeps each shard's gate and up, brings the weights again, and returns each
piece's gradient to its owner: a gradient accumulator travels behind each shard (or half), picking up every rank's
partial dW and arriving summed at the owner after D−1 hops (a ring reduce-scatter), or, broadcast, each partial dW is
reduced to the owner. dX stays local. recompute=selective equals none for TSP; full replays the block in backward
(docs/method.md#choice-recompute). Norms, embedding and LM head are replicated and run on local tokens
(docs/method.md#choice-embedding), so their gradients are all-reduced over the group; with vocab=ring the embedding
and LM head are sharded 1/D and travel the same weight ring as the MLP (schemes/ops/vocab_ring.py).

Communication per layer per rank, forward (elements received; W = (2+2/g+3F)·h² weights, K = 2·B·S·h/g):
    D broadcasts of (2+2/g)·h²/D  +  the MLP's 3F·h²/D shards: D−1 ring hops (biring: D−1 hops each way of half a
    shard; broadcast: D broadcasts)                             → W·(D−1)/D
    D all-gathers of 2·B·S·h/(g·D)                              → K·(D−1)/D
backward: the broadcasts and all-gathers again (none with regather_kv=false), D reduces (attention dW), D
reduce-scatters (dK/dV), the MLP's weights again and its gradients back (D−1 weight + D−1 gradient hops, each way for
the biring; broadcast: D broadcasts + D reduces): (2W + 2K)·(D−1)/D, so 3W + 3K per layer in forward + backward
(3W + 2K with regather_kv=false, docs/method.md#communication).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig
from tspbench.model import LayerKV, project_qkv, rope_cos_sin, swiglu
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm, reduce_from_region
from tspbench.schemes.ops.decode import Decodable, decode_attend
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.owner_attention import OwnerAttention, OwnerPlan, owner_loop
from tspbench.schemes.ops.ring import (
    CCW,
    CW,
    RingBuffers,
    broadcast_backward,
    broadcast_forward,
    pack,
    rings_backward,
    rings_forward,
    unpack,
)
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


# ---- attention: double-buffered broadcast loop + bucketed K/V all-gather ---------------------------------
class TSPAttention(nn.Module, Decodable):
    """Training and prefill run the owner loop of schemes/ops/owner_attention.py. Serving
    (schemes/ops/decode.py): the prefill caches each owner step's K/V of the local tokens, so a rank holds every
    head of its 1/D of the tokens; decode keeps the weights in place, all-gathers the new token's q, k, v over
    heads in one message and merges the ranks' partial attentions back onto the head owners."""

    kv: LayerKV | None = None

    def __init__(
        self,
        w: dict[str, nn.Parameter],
        comm: Comm,
        layout: SeqLayout,
        cfg: ModelConfig,
        bufs: RingBuffers,
        buckets: int,
        regather_kv: bool = True,
    ):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.layout, self.bufs, self.kv_bucket_heads = comm, layout, bufs, buckets
        self.regather_kv = regather_kv
        self.head_dim, self.theta = cfg.head_dim, cfg.rope  # base and scaling (model.rope_cos_sin)

    def _plan(self, own: torch.Tensor) -> OwnerPlan:
        return OwnerPlan(
            comm=self.comm,
            layout=self.layout,
            own=own,
            shapes=[self.wq.shape, self.wk.shape, self.wv.shape, self.wo.shape],
            head_dim=self.head_dim,
            theta=self.theta,
            kv_bucket_heads=self.kv_bucket_heads,
            tag=self.comm.log.tag,
            recv=self.bufs.get("attention_weights", own, count=3),  # r's, r+1's, r+2's in flight
            grads=self.bufs.get("attention_grads", own),
            regather_kv=self.regather_kv,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.decoding:
            return self.decode(x, positions)
        own = pack([self.wq.detach(), self.wk.detach(), self.wv.detach(), self.wo.detach()])
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, x.dtype)
        plan = self._plan(own)
        if self.kv is not None:  # prefill: every head of my tokens, in owner (= head) order
            ks: list[torch.Tensor] = []
            vs: list[torch.Tensor] = []

            def cache(k: torch.Tensor, v: torch.Tensor) -> None:
                ks.append(k)
                vs.append(v)

            y, _ = owner_loop(x, plan, cos, sin, on_kv=cache)
            self.kv.append(torch.cat(ks, dim=1), torch.cat(vs, dim=1))
            return y
        if not torch.is_grad_enabled():
            return owner_loop(x, plan, cos, sin)[0]
        return OwnerAttention.apply(x, self.wq, self.wk, self.wv, self.wo, plan, cos, sin)

    def decode(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [B, 1, h], the same on every rank. My weight shard stays here; the token's q, k, v of my heads
        are all-gathered over heads (one packed message), the owner of `position` caches k, v, and the partial
        attentions over each rank's cached tokens merge onto the head owners, whose W_O partial sums are
        all-reduced."""
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        nq, nk = q.shape[1], k.shape[1]
        qkv = self.comm.all_gather(torch.cat([q, k, v], 1).movedim(1, 0).contiguous(), dim=0)  # [D·(nq+2nk), B, 1, d]
        qkv = qkv.unflatten(0, (self.comm.size, nq + 2 * nk)).movedim(0, 2)  # [nq+2nk, B, D, 1, d]
        # rank-major heads (rank r's heads are r·n/D …): [n, B, D, 1, d] → [B, D, n, 1, d] → [B, D·n, 1, d]
        q, k, v = (t.permute(1, 2, 0, 3, 4).flatten(1, 2) for t in qkv.split([nq, nk, nk], 0))
        o = decode_attend(q, k, v, self.kv, self.comm, self.decode_state.position, scatter_heads=True)  # my heads
        return reduce_from_region(F.linear(o.transpose(1, 2).flatten(2), self.wo), self.comm)


# ---- gated MLP: weight ring (or bidirectional ring, or broadcasts), double-buffered --------------------------
def mlp_pieces(channels: int, exchange: str) -> list[slice]:
    """The channel ranges of a shard that travel as one message: the whole shard (ring, broadcast), or its two
    halves (biring: the first ⌈c/2⌉ channels clockwise, the rest counter-clockwise)."""
    if exchange == "biring" and channels >= 2:
        half = channels - channels // 2
        return [slice(0, half), slice(half, channels)]
    return [slice(0, channels)]


def _piece(w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, sl: slice) -> list[torch.Tensor]:
    """Gate and up rows, down columns of channels `sl`: a self-contained SwiGLU over those channels."""
    return [w_gate[sl], w_up[sl], w_down[:, sl]]


def exchange_forward(comm: Comm, exchange: str, owns: list[torch.Tensor], step, bufs: RingBuffers, label: str):
    """Every shard's pieces reach this rank: step(owner, piece, buf) once per (shard, piece) (schemes/ops/ring.py)."""
    if exchange == "broadcast":
        broadcast_forward(comm, owns[0], lambda owner, buf: step(owner, 0, buf), bufs, label)
    else:
        rings_forward(comm, owns, step, bufs, label, (CW, CCW)[: len(owns)])


def exchange_backward(comm: Comm, exchange: str, owns: list[torch.Tensor], partial_grad, bufs: RingBuffers, label):
    """This rank's gradient of each of its pieces, summed over the ranks (the dual of `exchange_forward`)."""
    if exchange == "broadcast":
        return [broadcast_backward(comm, owns[0], lambda owner, buf: partial_grad(owner, 0, buf), bufs, label)]
    return rings_backward(comm, owns, partial_grad, bufs, label, (CW, CCW)[: len(owns)])


class _RingMLP(torch.autograd.Function):
    """Y = Σ_shards SwiGLU(X; shard), the shards reaching this rank as `mlp_exchange` says (ring: shard (p−t) mod D
    at step t, hopping p → p+1 while the current one computes; biring: half of each shard each way round; broadcast:
    owner r's shard broadcast, r+1's in flight). Forward keeps each piece's gate and up projections of my tokens
    (2·F·h/D per token and shard: 2·F·h per token in all, what the single device keeps for its S tokens ÷ D);
    backward brings the weights again (their GEMMs need them) and returns each piece's gradient to its owner (a
    gradient accumulator following it round the ring, or a reduce to the owner; schemes/ops/ring.py). No GEMM is
    recomputed."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, comm: Comm, bufs: RingBuffers, exchange: str):
        ctx.comm, ctx.tag, ctx.bufs, ctx.exchange = comm, comm.log.tag, bufs, exchange
        pieces = mlp_pieces(w_gate.shape[0], exchange)
        shapes = [[t.shape for t in _piece(w_gate, w_up, w_down, sl)] for sl in pieces]
        y = torch.zeros_like(x)
        kept: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

        def step(owner, i, buf):
            wg, wu, wd = unpack(buf, shapes[i])
            g, u = F.linear(x, wg), F.linear(x, wu)
            kept[(owner, i)] = (g, u)
            y.add_(F.linear(F.silu(g) * u, wd))  # partial over this piece's channels

        owns = [pack(_piece(w_gate, w_up, w_down, sl)) for sl in pieces]
        exchange_forward(comm, exchange, owns, step, bufs, f"mlp:{ctx.tag}:fwd")
        # through save_for_backward, so recompute=full's checkpoint can drop and rebuild them
        ctx.save_for_backward(x, w_gate, w_up, w_down, *[t for key in sorted(kept) for t in kept[key]])
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w_gate, w_up, w_down, *flat = ctx.saved_tensors
        comm = ctx.comm
        pieces = mlp_pieces(w_gate.shape[0], ctx.exchange)
        shapes = [[t.shape for t in _piece(w_gate, w_up, w_down, sl)] for sl in pieces]
        keys = sorted((owner, i) for owner in range(comm.size) for i in range(len(pieces)))
        kept: dict = {key: (flat[2 * j], flat[2 * j + 1]) for j, key in enumerate(keys)}
        del flat
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        dx = torch.zeros_like(x2)

        def partial_grad(owner, i, buf):
            wg, wu, wd = unpack(buf, shapes[i])
            g, u = kept.pop((owner, i))
            g2, u2 = g.reshape(-1, g.shape[-1]), u.reshape(-1, u.shape[-1])
            sg = torch.sigmoid(g2)
            act = g2 * sg  # silu(gate), recomputed elementwise
            d_prod = dy2 @ wd  # [tokens, channels of the piece]
            dwd = dy2.t() @ (act * u2)
            du = d_prod * act
            dg = d_prod * u2 * sg * (1 + g2 * (1 - sg))
            dx.add_(dg @ wg + du @ wu)
            return torch.cat([(dg.t() @ x2).reshape(-1), (du.t() @ x2).reshape(-1), dwd.reshape(-1)])

        owns = [pack(_piece(w_gate, w_up, w_down, sl)).detach() for sl in pieces]
        with comm.log.scope(ctx.tag, backward=True):
            own_grads = exchange_backward(comm, ctx.exchange, owns, partial_grad, ctx.bufs, f"mlp:{ctx.tag}:bwd")
        grads = [unpack(gr, shapes[i]) for i, gr in enumerate(own_grads)]
        if len(grads) == 1:
            dwg, dwu, dwd = grads[0]
        else:  # biring: the pieces are channel ranges: gate and up rows, down columns
            dwg, dwu = (torch.cat([gr[j] for gr in grads], 0) for j in (0, 1))
            dwd = torch.cat([gr[2] for gr in grads], 1)
        return dx.view_as(x), dwg, dwu, dwd, None, None, None


class TSPMLP(nn.Module, Decodable):
    def __init__(self, w: dict[str, nn.Parameter], comm: Comm, bufs: RingBuffers, exchange: str = "ring"):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.comm, self.bufs, self.exchange = comm, bufs, exchange

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.decoding:  # one replicated token: my channels in place, partial sums all-reduced
            return reduce_from_region(swiglu(x, self.w_gate, self.w_up, self.w_down), self.comm)
        if not torch.is_grad_enabled():
            y = torch.zeros_like(x)
            pieces = mlp_pieces(self.w_gate.shape[0], self.exchange)
            parts = [_piece(self.w_gate, self.w_up, self.w_down, sl) for sl in pieces]
            shapes = [[t.shape for t in part] for part in parts]

            def step(_owner: int, i: int, buf: torch.Tensor) -> None:
                y.add_(swiglu(x, *unpack(buf, shapes[i])))

            exchange_forward(self.comm, self.exchange, [pack(part) for part in parts], step, self.bufs, "mlp")
            return y
        return _RingMLP.apply(x, self.w_gate, self.w_up, self.w_down, self.comm, self.bufs, self.exchange)


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.need("tsp")
    layout = SeqLayout(args.seq_len, comm.size, comm.rank, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    bufs = RingBuffers()  # the receive buffers every layer shares (one layer's loop ends before the next starts)
    for i, block in enumerate(module.blocks):
        block.attention = TSPAttention(
            shard_block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, comm, args, shards),
            comm,
            layout,
            cfg,
            bufs,
            par.kv_bucket_heads,
            par.regather_kv,
        )
        mlp_w = shard_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, comm, args, shards)
        block.mlp = TSPMLP(mlp_w, comm, bufs, par.mlp_exchange)
    vocab = (
        ring_vocab(module, cfg, comm, args, shards) if par.vocab == "ring" else None
    )  # docs/method.md#choice-embedding
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=comm)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=comm, vocab=vocab)

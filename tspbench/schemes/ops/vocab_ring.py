"""TSP with `vocab=ring` (docs/method.md#choice-embedding): the embedding and the LM head are sharded 1/D by vocabulary
like every other TSP weight, and meet the local tokens on the same weight ring as the MLP (schemes/ops/ring.py).

Maths. Rank p holds rows [p·V/D, (p+1)·V/D) of the embedding E and of the LM head W, and 1/D of the tokens.
    embedding   x = Σ_t E_{(p−t) mod D}[token], a token outside the shard contributing a zero row: D ring
                steps; backward: the rows' gradients (scatter-added per shard) ride the gradient ring to
                their owner (no weights needed).
    head + loss the logits never exist whole: for each shard the rank computes z_t = x·W_tᵀ for its tokens
                ([B, S/D, V/D]) and folds it into an online log-sum-exp (m, l) and the target logit (found in
                exactly one shard), so ℓ = m + log l − z_target. Backward re-circulates the head shards,
                recomputes z_t, and uses softmax_t − onehot_t = exp(z_t − lse) − onehot_t for dx (local) and
                for the shard's dW, which rides the gradient ring to its owner.
Communication per step (elements received per rank, V·h/D per hop): embedding D−1 weight hops forward and
D−1 gradient hops backward; head D−1 weight hops forward, D−1 weight + D−1 gradient hops backward: 2·V·h·(D−1)/D
forward, 3·V·h·(D−1)/D backward. Memory: 1/D of the embedding/head state; the cross-entropy holds one
[B, S/D, V/D] block at a time instead of [B, S/D, V].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig, require_untied
from tspbench.schemes.comm import Comm
from tspbench.schemes.ops.decode import Decodable
from tspbench.schemes.ops.ring import ring_backward, ring_forward
from tspbench.schemes.ops.sharding import ApplyArgs, Shard, slice_param


def _ids(tokens: torch.Tensor, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    local = tokens - start
    outside = (local < 0) | (local >= size)
    return local.masked_fill(outside, 0), outside


class _RingEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens: torch.Tensor, weight: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm, ctx.tag, ctx.wshape = comm, comm.log.tag, weight.shape
        size = weight.shape[0]
        out = weight.new_zeros((*tokens.shape, weight.shape[1]))

        def step(owner, buf):
            local, outside = _ids(tokens, owner * size, size)
            out.add_(F.embedding(local, buf.view(ctx.wshape)).masked_fill_(outside.unsqueeze(-1), 0))

        ring_forward(comm, weight.detach().reshape(-1), step)
        ctx.save_for_backward(tokens)
        return out

    @staticmethod
    def backward(ctx, dx: torch.Tensor):
        (tokens,) = ctx.saved_tensors
        size, h = ctx.wshape

        def partial_grad(owner, _):
            local, outside = _ids(tokens, owner * size, size)
            g = dx.new_zeros(ctx.wshape)
            g.index_add_(0, local.reshape(-1), dx.masked_fill(outside.unsqueeze(-1), 0).reshape(-1, h))
            return g.reshape(-1)

        with ctx.comm.log.scope(ctx.tag, backward=True):
            grad = ring_backward(ctx.comm, None, partial_grad)
        return None, grad.view(ctx.wshape), None


class _RingHeadLoss(torch.autograd.Function):
    """Per-token cross-entropy of x·Wᵀ with W's vocabulary shards on the ring, in at least fp32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, comm: Comm) -> torch.Tensor:
        ctx.comm, ctx.tag, ctx.wshape = comm, comm.log.tag, weight.shape
        acc = torch.promote_types(x.dtype, torch.float32)
        size = weight.shape[0]
        state = {
            "m": torch.full(targets.shape, -torch.inf, dtype=acc, device=x.device),
            "l": torch.zeros(targets.shape, dtype=acc, device=x.device),
        }
        target_z = torch.zeros(targets.shape, dtype=acc, device=x.device)

        def step(owner, buf):
            z = F.linear(x, buf.view(ctx.wshape)).to(acc)  # [B, S/D, V/D]
            local, outside = _ids(targets, owner * size, size)
            target_z.add_(z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill_(outside, 0))
            m = torch.maximum(state["m"], z.amax(-1))
            state["l"] = state["l"] * torch.exp(state["m"] - m) + torch.exp(z - m.unsqueeze(-1)).sum(-1)
            state["m"] = m

        ring_forward(comm, weight.detach().reshape(-1), step)
        lse = state["m"] + torch.log(state["l"])
        ctx.save_for_backward(x, weight, targets, lse)
        return lse - target_z

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, weight, targets, lse = ctx.saved_tensors
        size = ctx.wshape[0]
        dx = torch.zeros(x.shape, dtype=lse.dtype, device=x.device)

        def partial_grad(owner, buf):
            w = buf.view(ctx.wshape)
            p = torch.exp(F.linear(x, w).to(lse.dtype) - lse.unsqueeze(-1))  # softmax over the whole V
            local, outside = _ids(targets, owner * size, size)
            p.scatter_add_(-1, local.unsqueeze(-1), (~outside).to(p.dtype).neg().unsqueeze(-1))  # − onehot
            dz = (p * g.unsqueeze(-1)).to(x.dtype)
            dx.add_(dz @ w)
            return (dz.flatten(0, -2).transpose(0, 1) @ x.flatten(0, -2)).reshape(-1)

        with ctx.comm.log.scope(ctx.tag, backward=True):
            grad = ring_backward(ctx.comm, weight.detach().reshape(-1), partial_grad)
        return dx.to(x.dtype), grad.view(ctx.wshape), None, None


class RingEmbedding(nn.Module):
    def __init__(self, weight: nn.Parameter, comm: Comm):
        super().__init__()
        self.weight, self.comm = weight, comm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return _RingEmbedding.apply(tokens, self.weight, self.comm)


class RingHead(nn.Module, Decodable):
    """This rank's V/D rows of the LM head. Returns its input: the cross-entropy (`VocabRing.loss_sum`)
    consumes the hidden states, so no [tokens, V] logits are ever formed. Decode (one replicated token):
    this rank's V/D logits, no ring needed."""

    def __init__(self, weight: nn.Parameter, comm: Comm):
        super().__init__()
        self.weight, self.comm = weight, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) if self.decoding else x


class VocabRing:
    """ParallelModel's handle on the ring head: the loss, and full logits for verification only."""

    def __init__(self, head: RingHead):
        self.head = head

    def loss_sum(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _RingHeadLoss.apply(hidden, self.head.weight, targets, self.head.comm).sum()

    def full(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, S_loc, V] logits of these hidden states (gathers the whole head: verification only)."""
        return F.linear(hidden, self.head.comm.all_gather(self.head.weight.detach().contiguous(), 0))

    def full_decode(self, logits: torch.Tensor) -> torch.Tensor:
        """A decode step's [B, 1, V/D] logits → [B, 1, V]."""
        return self.head.comm.all_gather(logits.contiguous(), -1)


def ring_vocab(module: nn.Module, cfg: ModelConfig, comm: Comm, args: ApplyArgs, shards: dict[str, Shard]) -> VocabRing:
    """Replace `module.embed` / `module.lm_head` by this rank's 1/D vocabulary rows on the TSP ring."""
    require_untied(cfg, "vocab=ring")
    for name, cls in (("embed", RingEmbedding), ("lm_head", RingHead)):
        full = f"{name}.weight"
        w = slice_param(full, (cfg.vocab_size, cfg.dim), 0, comm.rank, comm.size, args.seed, args.dtype, args.device)
        setattr(module, name, cls(w, comm))
        shards[full] = Shard(full, 0, comm, None)
    head = module.lm_head
    assert isinstance(head, RingHead)
    return VocabRing(head)

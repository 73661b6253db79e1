"""Vocabulary parallelism on the tensor axis: Megatron's VocabParallelEmbedding, the column-parallel LM head
(gather_output=False) and vocab_parallel_cross_entropy, used by tp, tp_msp and tp_sp (T > 1).

Why. With a replicated head every TP rank computes all B·S·V logits in fp32 and holds the full embedding
and head with their optimizer state: for llama7b at 128K that is ≈ 50 GB per rank, more than every block
together. Megatron, torchtitan and NeMo all split the vocabulary over the tensor group; a TP baseline
without it is a strawman. sp and tsp keep the replicated head (tokens are already sharded, so their logits
are 1/D per rank; docs/method.md#choice-embedding).

Maths. Rank t of T holds rows [t·V/T, (t+1)·V/T) of the embedding E and of the LM head W.
    embedding  x = Σ_t E_t[token] — a token outside shard t contributes a zero row — so the shards'
               lookups are summed: all-reduce over tp (reduce-scatter along the sequence in tp_msp, whose
               residual stream is sequence-sharded).
    head       z_t = x·W_tᵀ, the V/T logits of shard t for every token the rank holds (entered through
               Megatron's f: identity forward, all-reduce of the input gradient backward; tp_msp
               all-gathers the sequence instead, reduce-scattering the gradient back).
    loss       ℓ = log Σ_t Σ_v exp(z_t,v − m) − (z_target − m), with m the max over all shards (all-reduce
               MAX; a constant shift, so no gradient), Σ exp and the target logit (found on exactly one
               shard) all-reduced over tp. ∂ℓ/∂z_t = softmax_t − onehot_t is local: no backward communication.
Every rank of the tensor group ends with the same per-token losses, so the loss is replicated over tp
(as in tp) and the logits are never gathered.

Communication per step (tagged "embed" and "head"): forward all-reduce (or reduce-scatter) of B·S·h after the
embedding and three all-reduces of B·S scalars in the loss; backward all-reduce (or reduce-scatter) of the
B·S·h head-input gradient. Memory: the fp32 logits are B·S·V/T per rank, and the embedding / head weights,
gradients and optimizer state 1/T.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig, require_untied
from tspbench.schemes.comm import (
    Comm,
    copy_to_region,
    gather_from_sequence,
    reduce_from_region,
    reduce_scatter_to_sequence,
)
from tspbench.schemes.ops.decode import Decodable
from tspbench.schemes.ops.sharding import ApplyArgs, Shard, slice_param


@dataclass
class VocabShard:
    """This rank's slice [start, start + size) of the vocabulary, split over `comm`."""

    comm: Comm
    start: int
    size: int

    def local_ids(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token id within the shard, clamped to 0 where outside; mask of tokens outside the shard)."""
        local = tokens - self.start
        outside = (local < 0) | (local >= self.size)
        return local.masked_fill(outside, 0), outside

    def loss_sum(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_loss_sum(logits, targets, self)

    def full(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, S_loc, V/T] → [B, S_loc, V] (verification only)."""
        return self.comm.all_gather(logits.contiguous(), -1)

    full_decode = full


class VocabParallelEmbedding(nn.Module, Decodable):
    """Rows `vocab.start …` of the embedding; sums the shards' lookups over the tensor group."""

    # serving (`decoding`): one replicated token, so tp_msp all-reduces instead of scattering

    def __init__(self, weight: nn.Parameter, vocab: VocabShard, scatter_seq: bool):
        super().__init__()
        self.weight, self.vocab, self.scatter_seq = weight, vocab, scatter_seq

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local, outside = self.vocab.local_ids(tokens)  # [B, S]
        x = F.embedding(local, self.weight).masked_fill_(outside.unsqueeze(-1), 0)  # [B, S, h], partial
        if self.scatter_seq and not self.decoding:
            return reduce_scatter_to_sequence(x, self.vocab.comm, dim=1)  # tp_msp: my S/T tokens
        return reduce_from_region(x, self.vocab.comm)


class VocabParallelHead(nn.Module, Decodable):
    """Column-parallel LM head: logits of this rank's V/T classes, never gathered."""

    def __init__(self, weight: nn.Parameter, vocab: VocabShard, gather_seq: bool):
        super().__init__()
        self.weight, self.vocab, self.gather_seq = weight, vocab, gather_seq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gather_seq and not self.decoding:
            x = gather_from_sequence(x, self.vocab.comm, dim=1)  # tp_msp: [B, S/T, h] → [B, S, h]
        else:
            x = copy_to_region(x, self.vocab.comm)  # f: all-reduce of dx backward
        return F.linear(x, self.weight)  # [B, S_loc, V/T]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of vocabulary-sharded logits, in at least fp32 (as `model.token_loss_sum`).

    Saves one [B, S, V/T] buffer (the softmax, computed in place), as Megatron's fused version does; its
    backward turns that buffer into the gradient in place, so it may run once (no retain_graph)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, vocab: VocabShard) -> torch.Tensor:
        comm = vocab.comm
        acc = torch.promote_types(logits.dtype, torch.float32)
        m = comm.all_reduce(logits.amax(-1).to(acc), op="max")  # [B, S] global max (a shift)
        z = logits - m.unsqueeze(-1)  # new buffer, promoted to acc
        local, outside = vocab.local_ids(targets)
        target_z = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill_(outside, 0)
        comm.all_reduce(target_z)  # the one shard that holds it
        sum_exp = comm.all_reduce(z.exp_().sum(-1))  # Σ over all V classes
        z.div_(sum_exp.unsqueeze(-1))  # softmax of my classes
        ctx.save_for_backward(z, local, outside)
        ctx.in_dtype = logits.dtype
        return sum_exp.log() - target_z  # [B, S]

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.mul_(g.unsqueeze(-1))  # g·softmax …
        grad.scatter_add_(-1, local.unsqueeze(-1), (-g).masked_fill(outside, 0).unsqueeze(-1))  # … − g·onehot
        return grad.to(ctx.in_dtype), None, None


def vocab_parallel_loss_sum(logits: torch.Tensor, targets: torch.Tensor, vocab: VocabShard) -> torch.Tensor:
    """Σ over tokens of the cross-entropy; the same value on every rank of the tensor group."""
    return _VocabParallelCrossEntropy.apply(logits, targets, vocab).sum()


def shard_vocab(
    module: nn.Module,
    cfg: ModelConfig,
    comm: Comm,
    args: ApplyArgs,
    shards: dict[str, Shard],
    grad_sum: Comm | None,
    sequence_parallel: bool,
) -> VocabShard:
    """Replace `module.embed` / `module.lm_head` by their vocabulary slices over `comm`.

    `grad_sum`: the group whose ranks use the same slice on different tokens (tp_sp: sp). `sequence_parallel`
    (tp_msp): the embedding reduce-scatters into the sequence-sharded residual stream and the head
    all-gathers it, so both see every token of the sequence."""
    require_untied(cfg, "the vocabulary split of vocab=auto")
    size = cfg.vocab_size // comm.size
    vocab = VocabShard(comm, comm.rank * size, size)
    for name, cls in (("embed", VocabParallelEmbedding), ("lm_head", VocabParallelHead)):
        full = f"{name}.weight"
        w = slice_param(full, (cfg.vocab_size, cfg.dim), 0, comm.rank, comm.size, args.seed, args.dtype, args.device)
        setattr(module, name, cls(w, vocab, sequence_parallel))
        shards[full] = Shard(full, 0, comm, grad_sum)
    return vocab

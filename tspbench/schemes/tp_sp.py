"""TP×SP — the 2-D baseline: tensor degree T (mesh axis "tp", innermost) × token degree Σ (axis "sp").

T·Σ ranks per replica (docs/method.md#naming, "TP+SP"). Rank (σ, t) holds weight shard t of every layer, sliced
exactly as in `tp`, and zigzag token shard σ, exactly as in `sp`.

Maths. Attention: rank (σ, t) projects its tokens X_σ onto heads t (column-parallel Q, K, V), exchanges
those heads' K/V with the Σ ranks of its sp group (all-gather or ring, from `sp`), attends, and multiplies
by the row-parallel W_O^t; the T head-shard partial sums are all-reduced over tp (Megatron's g) on the local
tokens only. MLP: `tp`'s column/row split on the local tokens, one all-reduce over tp.

Communication per layer (a = B·(S/Σ)·h: one local activation; n = B·S·(h/g)/T: one full-sequence K or V of
a head shard):
    forward   tp: 2 all-reduces of a (after attention, after MLP)         4·a·(T−1)/T
              sp: 2 all-gathers, output n (K, V) — or Σ−1 ring hops of [K; V]   2·n·(Σ−1)/Σ
    backward  tp: 2 all-reduces of a (the f's: attention and MLP inputs)   the same
              sp: 2 reduce-scatters, input n (dK, dV) — or Σ−1 reverse hops
    volume    4·B·(S/Σ)·h·(T−1)/T + 2·B·S·(h/(g·T))·(Σ−1)/Σ per rank forward (docs/method.md#communication).
Embedding and LM head are split by vocabulary over tp (schemes/ops/vocab.py; replicated when T = 1, as in sp):
logits [B, S/Σ, V/T]; the cross-entropy's all-reduces run over tp, the loss shares sum over sp.
Each weight shard (and each vocabulary slice and replicated norm weight) is used by the Σ ranks of an sp
group on different tokens, so its gradient is summed over sp after backward (finish_grad_sync).
T = 1 or Σ = 1 are allowed (degree ≥ 2): `ApplyArgs.comm` returns None for a size-1 axis and the
collectives of that axis are skipped.
"""

from __future__ import annotations

from torch import nn

from tspbench.config import ModelConfig, ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm
from tspbench.schemes.ops.kv_exchange import attend_sequence
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    MLP_SPLIT,
    ApplyArgs,
    Shard,
    check_shards,
    materialise_replicated,
    meta_model,
    replicated_weights,
    shard_block_weights,
)
from tspbench.schemes.ops.tensor_parallel import TPMLP, TPAttention
from tspbench.schemes.ops.vocab import shard_vocab


class TPSPAttention(TPAttention):
    """TP attention (heads over tp, f on entry, g on exit, on the local tokens) whose K/V come from the sp group,
    as in SP. With T = 1 the tp group is None and f, g are the identity."""

    def __init__(
        self,
        w: dict[str, nn.Parameter],
        tp: Comm | None,
        sp: Comm | None,
        layout: SeqLayout,
        cfg: ModelConfig,
        variant: str = "allgather",
    ):
        super().__init__(w, tp, cfg)
        self.sp, self.layout, self.variant = sp, layout, variant
        self.seq_comm = sp  # decode: the cache's tokens are sharded over sp

    def attend(self, q, k, v):
        # q: [B, n_h/T, S/Σ, d]; k, v: [B, n_kv/T, S/Σ, d] → [B, n_h/T, S/Σ, d]
        return attend_sequence(q, k, v, self.sp, self.layout, self.variant, self.core)


def _block_weights(
    module: nn.Module,
    prefix: str,
    split: dict[str, int],
    tp: Comm | None,
    args: ApplyArgs,
    shards: dict[str, Shard],
    sp: Comm | None,
) -> dict[str, nn.Parameter]:
    """tp's weight slices, their gradients summed over sp. T = 1: nothing to slice; the weights stay on meta
    and `materialise_replicated` gives them full values (with the same grad_sum=sp)."""
    if tp is None:
        return replicated_weights(module, split)
    return shard_block_weights(module, prefix, split, tp, args, shards, grad_sum=sp)


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    tp, sp = args.comm("tp"), args.comm("sp")
    layout = SeqLayout(args.seq_len, sp.size if sp else 1, sp.rank if sp else 0, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    for i, block in enumerate(module.blocks):
        aw = _block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, tp, args, shards, sp)
        block.attention = TPSPAttention(aw, tp, sp, layout, cfg, par.sp_variant)
        block.mlp = TPMLP(_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, tp, args, shards, sp), tp)
    vocab = (
        shard_vocab(module, cfg, tp, args, shards, grad_sum=sp, sequence_parallel=False)
        if tp and par.vocab_degree > 1
        else None
    )
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=sp)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=sp, vocab=vocab)

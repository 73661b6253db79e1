"""TP×SP — the 2-D baseline: tensor degree T (mesh axis "tp", innermost) × token degree Σ (axis "sp").

T·Σ ranks per replica (docs/method.md#naming, "TP+SP"). Rank (σ, t) holds weight shard t of every layer, sliced
exactly as in `tp`, and zigzag token shard σ, exactly as in `sp`. By default (`par.msp`, as Megatron runs TP + CP
with --sequence-parallel; docs/method.md#choice-tp-sp-msp) the tensor axis is also Megatron-SP's: outside
attention and MLP rank (σ, t) holds only the contiguous piece t of T of its shard, 1/(T·Σ) of the tokens.

Maths. Attention: rank (σ, t) projects the S/Σ tokens X_σ onto heads t (column-parallel Q, K, V), exchanges
those heads' K/V with the Σ ranks of its sp group (all-gather or ring, from `sp`), attends, and multiplies
by the row-parallel W_O^t. msp: X_σ is all-gathered over tp from the T pieces (Megatron's g̅), and the T
head-shard partial sums are reduce-scattered back to pieces (ḡ); msp=false: X_σ is replicated over tp and the
partial sums are all-reduced (Megatron's f, g). MLP: `tp`'s column/row split on X_σ, with the same entry/exit.

Communication per layer (a = B·(S/Σ)·h: one shard's activation; n = B·S·(h/g)/T: one full-sequence K or V of
a head shard):
    forward   tp: msp 2 all-gathers (output a) + 2 reduce-scatters (input a)   4·a·(T−1)/T
                  msp=false: 2 all-reduces of a                                 the same
              sp: 1 all-gather of packed [K; V], output 2n — or Σ−1 ring hops   2·n·(Σ−1)/Σ
    backward  tp: the duals (msp: reduce-scatter ↔ all-gather, + the 2 inputs re-gathered from the saved pieces as
                  Megatron does, 6·a·(T−1)/T; else the f's all-reduces, the same volume; ops/tensor_parallel.py)
              sp: 1 reduce-scatter of [dK; dV] — or Σ−1 reverse hops
    volume    4·B·(S/Σ)·h·(T−1)/T + 2·B·S·(h/(g·T))·(Σ−1)/Σ per rank forward (docs/method.md#communication).
Embedding and LM head are split by vocabulary over tp (schemes/ops/vocab.py; replicated when T = 1, as in sp):
logits [B, S/Σ, V/T]; the cross-entropy's all-reduces run over tp, the loss shares sum over sp. msp: the
embedding reduce-scatters its partial lookups into the pieces and the head all-gathers them (as tp_msp, on
the shard); with vocab=replicated the embedding, norms and head run on the rank's S/(T·Σ) tokens (SplitLayout)
and the loss shares sum over the flattened sp × tp group.
Each weight shard (and each vocabulary slice) is used by the Σ ranks of an sp group on different tokens, so its
gradient is summed over sp after backward (finish_grad_sync); the norm weights see different tokens on all
T·Σ ranks under msp, so theirs are summed over sp × tp in the same one all-reduce (with dp).
T = 1 or Σ = 1 are allowed (degree ≥ 2): `ApplyArgs.comm` returns None for a size-1 axis and the
collectives of that axis are skipped (T = 1: msp has nothing to split and is the plain form).
"""

from __future__ import annotations

from torch import nn

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm, reduce_scatter_to_sequence
from tspbench.schemes.ops.kv_exchange import attend_sequence
from tspbench.schemes.ops.layout import SeqLayout, SplitLayout
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
from tspbench.schemes.ops.tensor_parallel import TPMLP, SeqParallelMLP, TPAttention
from tspbench.schemes.ops.ulysses import ulysses_attention
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

    def attend_project(self, q, k, v):
        if self.variant == "ulysses" and self.sp is not None:  # its output exchange is fused with W_O
            return ulysses_attention(q, k, v, self.wo, self.sp, self.layout, self.core)
        return super().attend_project(q, k, v)


class MSPSPAttention(TPSPAttention):
    """tp_sp with Megatron-SP on the tensor axis: the entry all-gathers the T pieces of shard σ (in local order)
    and the exit reduce-scatters the head-shard partial sums back to them. Decoding: TPAttention.decode (f and g
    on the replicated token; sequence parallelism off, as in Megatron)."""

    tp: Comm  # Megatron-SP needs a tensor group of T ≥ 2 ranks

    def __init__(self, w, tp: Comm, sp, layout, cfg, variant="allgather"):
        super().__init__(w, tp, sp, layout, cfg, variant)
        self.tp = tp

    sequence_parallel = True  # the column-parallel entry gathers [B, S/(T·Σ), h] → [B, S/Σ, h]

    def gemm_positions(self, x, positions):
        return self.layout.positions  # shard σ's global positions (the caller's are its piece's, or the shard's)

    def exit(self, y):
        return reduce_scatter_to_sequence(y, self.tp, dim=1)  # Σ over head shards, keep my piece


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
    msp = tp if par.msp else None  # T = 1: nothing to split, the plain form
    for i, block in enumerate(module.blocks):
        aw = _block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, tp, args, shards, sp)
        mw = _block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, tp, args, shards, sp)
        if msp is not None:
            block.attention = MSPSPAttention(aw, msp, sp, layout, cfg, par.sp_variant)
            block.mlp = SeqParallelMLP(mw, msp)
        else:
            block.attention = TPSPAttention(aw, tp, sp, layout, cfg, par.sp_variant)
            block.mlp = TPMLP(mw, tp)
    vocab = (
        shard_vocab(module, cfg, tp, args, shards, grad_sum=sp, sequence_parallel=msp is not None)
        if tp and par.vocab_degree > 1
        else None
    )
    if msp is None:
        materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=sp)
        return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=sp, vocab=vocab)
    # Megatron-SP: the norms (and a replicated embedding / head) see rank (σ, t)'s own tokens: gradients summed
    # over sp × tp (rank σ·T + t of the flattened group).
    flat = args.flat("sp", "tp")
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=flat)
    if vocab is not None:  # inputs, targets and loss on shard σ; the embedding scatters, the head gathers
        return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=sp, vocab=vocab)
    piece = SplitLayout(layout.seq_len, layout.degree, layout.rank, True, args.device, parts=msp.size, part=msp.rank)
    pm = ParallelModel(module, par, check_shards(module, shards), args, layout=piece, seq=flat)
    pm.kv_seq = sp  # the attention caches shard σ's tokens (its heads), not the piece's
    return pm

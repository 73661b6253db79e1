"""TP — Megatron tensor parallelism over a group of T ranks (Shoeybi et al. 2019).

Maths. Attention: Q,K,V = X·[W_Q^1 … W_Q^T] column-parallel by heads (rank t holds heads t·n_h/T …, and
the n_kv/T KV heads they use, or with T > n_kv one KV head replicated over T/n_kv ranks,
docs/method.md#choice-gqa); O = Σ_t A_t·W_O^t row-parallel. MLP: gate/up column-parallel over the
intermediate dim, down row-parallel: Y = Σ_t (silu(X·W_g^tᵀ) ⊙ X·W_u^tᵀ)·W_d^tᵀ.

Communication per layer (B·S·h elements each):
    forward   f = identity, g = all-reduce   → 2 all-reduces (after attention, after MLP)
    backward  f = all-reduce, g = identity   → 2 all-reduces (f is folded into the column-parallel Function of
              ops/tensor_parallel.py, Megatron's default: the dgrad's all-reduce posted before the wgrad GEMMs)
    volume    4·B·S·h·(T−1)/T received per rank forward (docs/method.md#communication), the same backward.
Tokens are replicated: every rank runs norms and residuals on the full sequence, so the (replicated) norm
weights get identical gradients and need no reduction. Embedding and LM head are split by vocabulary
(schemes/ops/vocab.py): one more all-reduce after the embedding, the LM head's f, and three B·S-scalar
all-reduces in the cross-entropy; the logits stay [B, S, V/T].
"""

from __future__ import annotations

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    MLP_SPLIT,
    ApplyArgs,
    check_shards,
    materialise_replicated,
    meta_model,
    shard_block_weights,
)
from tspbench.schemes.ops.tensor_parallel import TPMLP, TPAttention
from tspbench.schemes.ops.vocab import shard_vocab


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.need("tp")
    module, shards = meta_model(cfg, par.recompute)
    for i, block in enumerate(module.blocks):
        block.attention = TPAttention(
            shard_block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, comm, args, shards), comm, cfg
        )
        block.mlp = TPMLP(shard_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, comm, args, shards), comm)
    vocab = (
        shard_vocab(module, cfg, comm, args, shards, grad_sum=None, sequence_parallel=False)
        if par.vocab_degree > 1
        else None
    )  # vocab=replicated: every rank the whole head
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=None)
    return ParallelModel(module, par, check_shards(module, shards), args, vocab=vocab)

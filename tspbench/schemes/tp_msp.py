"""tp_msp — TP + Megatron sequence parallelism over T ranks (Korthikanti et al. 2022).

Maths. Identical weight split to `tp` (column-parallel Q,K,V and gate/up, row-parallel O and down). The
difference is only outside the GEMMs: norms and residuals run on a contiguous 1/T slice of the sequence,
so their activations are not replicated. Entering a block the shard is all-gathered to the
full sequence (g̅); leaving it, the row-parallel partial sums are reduce-scattered back to shards (ḡ),
replacing TP's all-reduce with the same volume.

Communication per layer (B·S·h elements each):
    forward   attention: all-gather in, reduce-scatter out; MLP: the same → 2 AG + 2 RS
    backward  the duals: reduce-scatter for each all-gather, all-gather for each reduce-scatter, and the 2 inputs
              re-gathered from the pieces each column-parallel Function saved (Megatron: the piece is kept, not the
              gathered [S, h]; ops/tensor_parallel.py), the re-gather behind the dgrad GEMMs, the dgrad's
              reduce-scatter behind the wgrad GEMMs
    volume    4·B·S·h·(T−1)/T received per rank forward (docs/method.md#communication), 6·B·S·h·(T−1)/T backward.
Embedding and LM head are split by vocabulary, as in Megatron (schemes/ops/vocab.py): the embedding takes the
whole sequence's token ids and reduce-scatters its partial lookups into the sequence-sharded residual stream;
the head all-gathers the final norm's output and produces [B, S, V/T] logits, so the cross-entropy (and the
loss) is over the whole sequence and replicated over the group, exactly as in tp.
The norm weights see different tokens on each rank, so their gradients are summed over the group after
backward (Megatron's all-reduce of sequence-parallel gradients).
"""

from __future__ import annotations

import torch

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import reduce_scatter_to_sequence
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    MLP_SPLIT,
    ApplyArgs,
    check_shards,
    materialise_replicated,
    meta_model,
    shard_block_weights,
)
from tspbench.schemes.ops.tensor_parallel import SeqParallelMLP, TPAttention
from tspbench.schemes.ops.vocab import shard_vocab


class MSPAttention(TPAttention):
    """TP attention whose column-parallel entry gathers the sequence and whose exit reduce-scatters it."""

    sequence_parallel = True

    def gemm_positions(self, x, positions):
        assert self.comm is not None  # tp_msp's tensor group always has T ≥ 2 ranks
        return torch.arange(x.shape[1] * self.comm.size, device=x.device)  # contiguous pieces: logical order

    def exit(self, y):
        assert self.comm is not None
        return reduce_scatter_to_sequence(y, self.comm, dim=1)  # Σ over head shards, keep my S/T

    # decode: TPAttention.decode (f and g on the replicated token; sequence parallelism off, as in Megatron)


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.need("tp")
    module, shards = meta_model(cfg, par.recompute)
    for i, block in enumerate(module.blocks):
        block.attention = MSPAttention(
            shard_block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT, comm, args, shards), comm, cfg
        )
        block.mlp = SeqParallelMLP(
            shard_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, comm, args, shards), comm
        )
    if par.vocab_degree == 1:
        # vocab=replicated: embedding, norms and head on this rank's contiguous S/T tokens, their gradients
        # summed over the group; the loss shares sum over it.
        materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=comm)
        layout = SeqLayout(args.seq_len, comm.size, comm.rank, zigzag=False, device=args.device)
        return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=comm)
    vocab = shard_vocab(module, cfg, comm, args, shards, grad_sum=None, sequence_parallel=True)
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=comm)
    # Inputs, targets and the loss cover the whole sequence (as in tp): the embedding scatters the sequence
    # into contiguous S/T shards and the head gathers it back; the blocks' enter re-derives positions.
    return ParallelModel(module, par, check_shards(module, shards), args, vocab=vocab)

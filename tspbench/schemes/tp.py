"""TP — Megatron tensor parallelism over a group of T ranks (Shoeybi et al. 2019).

Maths. Attention: Q,K,V = X·[W_Q^1 … W_Q^T] column-parallel by heads (rank t holds heads t·n_h/T …, and
the n_kv/T KV heads they use); O = Σ_t A_t·W_O^t row-parallel. MLP: gate/up column-parallel over the
intermediate dim, down row-parallel: Y = Σ_t (silu(X·W_g^tᵀ) ⊙ X·W_u^tᵀ)·W_d^tᵀ.

Communication per layer (B·S·h elements each):
    forward   f = identity, g = all-reduce   → 2 all-reduces (after attention, after MLP)
    backward  f = all-reduce, g = identity   → 2 all-reduces
    volume    4·B·S·h·(T−1)/T received per rank forward (tsp-method.md §5), the same backward.
Tokens are replicated: every rank runs norms and residuals on the full sequence, so the (replicated) norm
weights get identical gradients and need no reduction. Embedding and LM head are split by vocabulary
(schemes/vocab.py): one more all-reduce after the embedding, the LM head's f, and three B·S-scalar
all-reduces in the cross-entropy; the logits stay [B, S, V/T].
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig, ParallelConfig
from tspbench.model import LayerKV, causal_attention, project_qkv, swiglu
from tspbench.schemes.base import (ApplyArgs, ParallelModel, Shard, materialise_replicated, meta_model,
                                   slice_param)
from tspbench.schemes.comm import Comm, copy_to_region, reduce_from_region
from tspbench.schemes.ops.decode import decode_attend
from tspbench.schemes.ops.vocab import shard_vocab

# (reference parameter, shard dim): column-parallel weights split rows (dim 0), row-parallel columns (dim 1).
ATTN_SPLIT = {"wq": 0, "wk": 0, "wv": 0, "wo": 1}
MLP_SPLIT = {"w_gate": 0, "w_up": 0, "w_down": 1}


def shard_block_weights(module: nn.Module, prefix: str, split: dict[str, int], comm: Comm, args: ApplyArgs,
                        shards: dict[str, Shard], grad_sum: Comm | None = None) -> dict[str, nn.Parameter]:
    """This rank's slice (index comm.rank of comm.size) of each weight of a reference submodule."""
    out = {}
    for pname, dim in split.items():
        full_name = f"{prefix}.{pname}"
        shape = tuple(getattr(module, pname).shape)
        out[pname] = slice_param(full_name, shape, dim, comm.rank, comm.size, args.seed, args.dtype, args.device)
        shards[full_name] = Shard(full_name, dim, comm, grad_sum)
    return out


class TPAttention(nn.Module):
    """Heads split over the tensor group. `enter`/`exit` are the region mappings; tp_msp and tp_sp
    subclass this and change only them. Serving (schemes/decode.py): `kv` caches this rank's heads during
    the prefill; with `decoding` set, one replicated token attends to the cache (Megatron's f and g)."""

    decoding = False
    kv: LayerKV | None = None

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm | None, cfg: ModelConfig):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.head_dim, self.theta = comm, cfg.head_dim, cfg.rope_theta

    seq_comm: Comm | None = None
    """The group the cache's tokens are sharded over (tp_sp: sp); None: this rank caches every token."""

    def enter(self, x, positions):
        return copy_to_region(x, self.comm), positions       # f: identity fwd, all-reduce bwd

    def exit(self, y):
        return reduce_from_region(y, self.comm)               # g: all-reduce fwd, identity bwd

    def attend(self, q, k, v):
        return causal_attention(q, k, v, q_offset=0)         # full sequence: plain causal

    def forward(self, x, positions):
        if self.decoding:
            return self.decode(x, positions)
        x, positions = self.enter(x, positions)               # [B, S, h]
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        if self.kv is not None:                               # prefill: cache what this rank computed
            self.kv.append(k, v)
        o = self.attend(q, k, v)                              # [B, n_h/T, S, d]
        return self.exit(F.linear(o.transpose(1, 2).flatten(2), self.wo))  # partial sum over head shards

    def decode(self, x, positions):
        """x: [B, 1, h], the same on every rank; positions: [position]."""
        x = x if self.comm is None else copy_to_region(x, self.comm)
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        o = decode_attend(q, k, v, self.kv, self.seq_comm, self.decode_state.position)    # [B, n_h/T, 1, d]
        y = F.linear(o.transpose(1, 2).flatten(2), self.wo)
        return y if self.comm is None else reduce_from_region(y, self.comm)


class TPMLP(nn.Module):
    decoding = False

    def __init__(self, w: dict[str, nn.Parameter], comm: Comm):
        super().__init__()
        self.w_gate, self.w_up, self.w_down = w["w_gate"], w["w_up"], w["w_down"]
        self.comm = comm

    def enter(self, x):
        return copy_to_region(x, self.comm)

    def exit(self, y):
        return reduce_from_region(y, self.comm)

    def forward(self, x):
        return self.exit(swiglu(self.enter(x), self.w_gate, self.w_up, self.w_down))  # partial over F·h/T


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.comm("tp")
    module, shards = meta_model(cfg, par.recompute), {}
    for i, block in enumerate(module.layers):
        block.attention = TPAttention(shard_block_weights(block.attention, f"layers.{i}.attention", ATTN_SPLIT,
                                                          comm, args, shards), comm, cfg)
        block.mlp = TPMLP(shard_block_weights(block.mlp, f"layers.{i}.mlp", MLP_SPLIT, comm, args, shards), comm)
    vocab = (shard_vocab(module, cfg, comm, args, shards, grad_sum=None, sequence_parallel=False)
             if par.vocab_degree > 1 else None)          # vocab=replicated: every rank the whole head
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=None)
    return ParallelModel(module, par, check_shards(module, shards), None, None, args.comm("dp"), args.log, vocab)


def check_shards(module: nn.Module, shards: dict[str, Shard]) -> dict[str, Shard]:
    """Every local parameter must have a shard spec (keyed by its name, which equals the reference name)."""
    out = {}
    for name, _ in module.named_parameters():
        if name in shards:
            out[name] = shards[name]
        else:
            raise KeyError(f"no shard spec for local parameter {name}")
    return out

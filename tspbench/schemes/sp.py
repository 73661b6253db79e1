"""SP — the TSP paper's "SP": token sharding = context parallelism over a group of Σ ranks.

Not Megatron-SP (that is `tp_msp`; docs/method.md#naming). Weights are replicated; rank p holds the zigzag
token shard {chunk p, chunk 2Σ−1−p} of 2Σ chunks (docs/method.md#choice-zigzag), so every rank has one early and
one late chunk and the causal work is equal. Everything token-wise (embedding, norms, residuals, RoPE at global
positions, MLP, LM head) runs unchanged on the shard; only attention needs other ranks' tokens.

Maths. Attention of rank p: O_p = softmax(Q_p·K_{≤pos}ᵀ/√d)·V_{≤pos}, with Q_p = X_p·W_Qᵀ from local tokens
and K, V of the whole sequence. Three ways to obtain K, V (docs/method.md#choice-sp-variant; `par.sp_variant`):
    allgather (default)  all-gather K and V along the sequence, un-zigzag, causal attention per local chunk
    ring                 Σ−1 peer-to-peer K/V hops with an online-softmax merge (ring_attention.py)
    ulysses              DeepSpeed-Ulysses (ops/ulysses.py, docs/method.md#ulysses): all-to-alls of Q, K and V
                         from token shards to head shards, each behind the next projection (DeepSpeed's overlap),
                         whole-sequence causal attention on n_h/Σ heads, all-to-all of the output back, fused with
                         W_O; needs n_h and n_kv divisible by Σ

Communication per layer (n = B·S·(h/g) elements = one full-sequence K or V):
    forward   allgather: 2 all-gathers (K, V), output n each     ring: Σ−1 send/recv hops of packed [K; V]
    backward  allgather: 2 reduce-scatters (dK, dV), input n each ring: Σ−1 reverse hops of [dK; dV]
    volume    2·B·S·(h/g)·(Σ−1)/Σ received per rank forward (docs/method.md#communication), the same backward; the
              ring moves the same bytes point-to-point.
    ulysses   forward (B·S/Σ)·(2h + 2h/g)·(Σ−1)/Σ (all-to-alls of [Q; K; V] and O), backward the same (inverses).
Decode (every variant): the prefill caches the local tokens' K/V, so the cache stays token-sharded and decode is
the same partial-attention merge for all three (ops/decode.py).
No activation all-reduce: ranks own different tokens. Each replicated weight sees only local tokens, so its
gradient is a partial sum, completed by one all-reduce over the group after backward (finish_grad_sync;
2·W·(Σ−1)/Σ, not per layer).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from tspbench.config import ModelConfig
from tspbench.model import CoreAttention, LayerKV, project_qkv
from tspbench.parallel import ParallelConfig
from tspbench.schemes.base import ParallelModel
from tspbench.schemes.comm import Comm
from tspbench.schemes.ops.decode import Decodable, decode_attend
from tspbench.schemes.ops.kv_exchange import attend_sequence
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import (
    ATTN_SPLIT,
    ApplyArgs,
    check_shards,
    materialise_replicated,
    meta_model,
    replicated_weights,
)
from tspbench.schemes.ops.ulysses import ulysses_attention, ulysses_project_attend


class SPAttention(nn.Module, Decodable, CoreAttention):
    """All heads, local tokens; the only change from the reference is where K/V come from. Serving: the
    prefill caches the local tokens' K/V; decode merges the ranks' partial attentions (schemes/ops/decode.py)."""

    kv: LayerKV | None = None

    def __init__(
        self, w: dict[str, nn.Parameter], comm: Comm, layout: SeqLayout, cfg: ModelConfig, variant: str = "allgather"
    ):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = w["wq"], w["wk"], w["wv"], w["wo"]
        self.comm, self.layout, self.variant = comm, layout, variant
        self.head_dim, self.theta = cfg.head_dim, cfg.rope  # base and scaling

    def attend(self, q, k, v):
        return attend_sequence(q, k, v, self.comm, self.layout, self.variant, self.core)

    def forward(self, x, positions):
        # x: [B, S/Σ, h] zigzag shard; positions: its global positions, so RoPE matches the reference
        ulysses = self.variant == "ulysses" and not self.decoding
        if ulysses and self.kv is None:  # DeepSpeed's overlap: each projection's exchange behind the next one
            w = (self.wq, self.wk, self.wv, self.wo)
            return ulysses_project_attend(x, w, positions, self.head_dim, self.theta, self.comm, self.layout, self.core)
        q, k, v = project_qkv(x, self.wq, self.wk, self.wv, positions, self.head_dim, self.theta)
        if self.decoding:  # one replicated token
            o = decode_attend(q, k, v, self.kv, self.comm, self.decode_state.position)
        else:
            if self.kv is not None:  # prefill: cache my tokens
                self.kv.append(k, v)
            if ulysses:
                return ulysses_attention(q, k, v, self.wo, self.comm, self.layout, self.core)
            o = self.attend(q, k, v)  # [B, n_h, S/Σ, d]
        return F.linear(o.transpose(1, 2).flatten(2), self.wo)  # all heads local: no reduction


def apply(cfg: ModelConfig, par: ParallelConfig, args: ApplyArgs) -> ParallelModel:
    comm = args.need("sp")
    layout = SeqLayout(args.seq_len, comm.size, comm.rank, zigzag=True, device=args.device)
    module, shards = meta_model(cfg, par.recompute)
    for block in module.blocks:  # MLP, norms: token-wise, the reference modules as they are
        block.attention = SPAttention(
            replicated_weights(block.attention, ATTN_SPLIT), comm, layout, cfg, par.sp_variant
        )
    # every weight is replicated but used on this rank's tokens only: gradient summed over the sp group
    materialise_replicated(module, shards, args.seed, args.dtype, args.device, grad_sum=comm)
    return ParallelModel(module, par, check_shards(module, shards), args, layout=layout, seq=comm)

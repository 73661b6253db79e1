"""Serving: KV-cache prefill and one-token decode for every scheme (docs/method.md#serving,
docs/method.md#choice-decode).

Prefill is each scheme's own forward with a KV cache switched on (`ParallelModel.start_kv_cache`). Every
scheme caches the K/V its forward already computes, so the cache is sharded like its heads and tokens:
    tp, tp_msp   this rank's heads × all tokens                     1/T of the cache
    sp           all heads × this rank's (zigzag) tokens             1/Σ
    tp_sp        this rank's heads × this rank's tokens              1/(T·Σ)
    tsp          all heads × this rank's tokens (each owner step's   1/D   (docs/method.md#serving)
                 K/V of the local tokens, stacked in head order)
Decode (`ParallelModel.decode`): one new token cannot be split D ways, so it is replicated on every rank.
  * Weights sharded by heads / channels (tp, tp_msp, tp_sp, tsp): Megatron's f and g: each rank applies
    its own shard and the attention output projection and the MLP are all-reduced. tp_msp turns sequence
    parallelism off for decode, as Megatron does for inference. tsp uses the shard it owns in place, so no
    weight moves ("gather queries, not weights", docs/method.md#choice-decode).
  * Cache sharded by tokens (sp, tp_sp, tsp): each rank attends the query to the keys it caches and gets a
    partial output o_r and log-sum-exp lse_r per head; the partials merge exactly (flash-decoding / tree
    attention):  o = Σ_r e^(lse_r − m)·o_r / Σ_r e^(lse_r − m),  m = max_r lse_r  (all-reduce MAX, SUM).
    In tsp a rank's query covers its own heads while its cache holds every head, so the queries are
    all-gathered over heads first and the merged numerator is reduce-scattered back to the head owners.
  * The new token's K/V are appended on one rank of the sequence group, rank (position mod group size), so
    every cached token is attended exactly once and the cache stays balanced.

Communication per layer and decode step (B·h elements are tiny next to the cache, which never moves):
    tp, tp_msp   2 all-reduces of B·h
    sp           2 all-reduces: the max of B·n_h log-sum-exps, then numerator and denominator packed, B·n_h·(d + 1)
    tp_sp        both of the above, the merge on the local heads
    tsp          one all-gather of q, k, v packed (B·(n_h + 2·n_kv)·d), the merge (its numerator reduce-scattered over
                 heads), 2 all-reduces of B·h
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tspbench.attention import attention_lse
from tspbench.model import LayerKV
from tspbench.schemes.comm import Comm


@dataclass
class DecodeState:
    """The step being decoded, shared by a model's decode-capable modules (set once per step by
    ParallelModel.decode): the global position as a host integer, so choosing the cache owner never reads
    the device-side positions tensor (a device→host sync per layer inside the timed window)."""

    position: int = 0


class Decodable:
    """A module with a serving path. ParallelModel switches `decoding` on for decode steps (once, not per token)
    and hands every such module the model's shared DecodeState."""

    decoding: bool = False
    decode_state: DecodeState


def is_owner(position: int, comm: Comm | None) -> bool:
    """Does this rank cache the token at `position` (rank position mod group size of the sequence group)?"""
    return comm is None or position % comm.size == comm.rank


def partial_attention(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None):
    """One query position against cached keys that all precede it (no mask needed), on the attention kernel
    with its log-sum-exp (tspbench/attention.py: K/V heads grouped natively, no fp32 copy of the cache).

    q: [B, n_q, 1, d]; k, v: [B, n_kv, L, d] (None or L = 0: no keys on this rank). Returns the output
    normalised over these keys [B, n_q, 1, d] (q's dtype) and its log-sum-exp [B, n_q, 1] (fp32, fp64 for fp64)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    if k is None or k.shape[2] == 0:
        return (
            torch.zeros(q.shape, dtype=q.dtype, device=q.device),
            torch.full(q.shape[:-1], -math.inf, dtype=acc, device=q.device),
        )
    assert v is not None
    o, lse, *_ = attention_lse(q, k, v, causal=False)
    return o, lse.to(acc)


def merge_partials(o: torch.Tensor, lse: torch.Tensor, comm: Comm | None, scatter_heads: bool = False):
    """Exact combination of the group's partial attentions (module docstring). `scatter_heads`: return only
    this rank's 1/p of the heads (dim 1), reduce-scattering the numerator instead of all-reducing it."""
    if comm is None:
        return o
    m = comm.all_reduce(lse.clone(), op="max")  # [B, n_q, 1], a common shift for every rank's weights
    w = torch.exp(lse - m).unsqueeze(-1)  # a rank with no keys: 0
    packed = torch.cat([o * w, w], dim=-1)  # [B, n_q, 1, d + 1]: numerator and denominator in one message
    if scatter_heads:
        packed = comm.reduce_scatter(packed, dim=1)  # this rank's heads only
    else:
        packed = comm.all_reduce(packed)
    return packed[..., :-1] / packed[..., -1:]


def decode_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: LayerKV | None,
    seq: Comm | None,
    position: int,
    scatter_heads: bool = False,
) -> torch.Tensor:
    """Attention of the new token (heads of q) over the cache sharded by tokens over `seq` (None: whole
    cache here): append on the owner, attend locally, merge. Returns [B, n_q, 1, d] in q's dtype
    (`scatter_heads`: this rank's 1/p of the heads, as tsp needs)."""
    assert kv is not None, "decode without a KV cache (ParallelModel.start_kv_cache first)"
    if is_owner(position, seq):
        kv.append(k, v)
    o, lse = partial_attention(q, kv.k, kv.v)
    return merge_partials(o, lse, seq, scatter_heads).to(q.dtype)

"""How token-sharded ranks attend over the whole sequence: the K/V exchange of sp and tp_sp (variants in
docs/method.md#choice-sp-variant).

    allgather (default)  all-gather K and V along the sequence, un-zigzag, causal attention per local chunk
    ring                 Σ−1 peer-to-peer K/V hops with an online-softmax merge (ring_attention.py)
"""

from __future__ import annotations

import torch

from tspbench.schemes.comm import Comm, gather_from_sequence
from tspbench.schemes.ops.layout import SeqLayout, attend_shard
from tspbench.schemes.ops.ring_attention import ring_attention


def attend_sequence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm | None, layout: SeqLayout, variant: str = "allgather"
) -> torch.Tensor:
    """Causal attention of local queries against the whole sequence's K/V, exchanged over `comm`.

    q: [B, n_q, S/Σ, d]; k, v: [B, n_kv, S/Σ, d], local zigzag order → [B, n_q, S/Σ, d]. `comm` None means
    Σ = 1 (a degenerate tp_sp factorisation): the local tokens are the whole sequence, nothing to exchange.
    """
    if comm is None:
        return attend_shard(q, k, v, layout)
    if variant == "ring":
        return ring_attention(q, k, v, comm, layout)
    # all-gather fwd / reduce-scatter bwd; the gather is in rank order, unshard restores logical order
    k_full = layout.unshard(gather_from_sequence(k, comm, dim=2), dim=2)  # [B, n_kv, S, d]
    v_full = layout.unshard(gather_from_sequence(v, comm, dim=2), dim=2)  # [B, n_kv, S, d]
    return attend_shard(q, k_full, v_full, layout)

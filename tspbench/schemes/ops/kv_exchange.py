"""How token-sharded ranks attend over the whole sequence: the K/V exchange of sp and tp_sp (variants in
docs/method.md#choice-sp-variant).

    allgather (default)  all-gather K and V along the sequence, un-zigzag, causal attention per local chunk
    ring                 Σ−1 peer-to-peer K/V hops with an online-softmax merge (ring_attention.py)
    ulysses              DeepSpeed-Ulysses: all-to-all from token shards to head shards and back (ulysses.py, called
                         by the attention modules themselves: its output exchange is fused with W_O)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tspbench.schemes.comm import Comm, gather_from_sequence
from tspbench.schemes.ops.layout import SeqLayout, attend_shard
from tspbench.schemes.ops.ring_attention import ring_attention


def attend_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: Comm | None,
    layout: SeqLayout,
    variant: str = "allgather",
    core: Callable = lambda fn, *args: fn(*args),
) -> torch.Tensor:
    """Causal attention of local queries against the whole sequence's K/V, exchanged over `comm`.

    q: [B, n_q, S/Σ, d]; k, v: [B, n_kv, S/Σ, d], local zigzag order → [B, n_q, S/Σ, d]. `comm` None means
    Σ = 1 (a degenerate tp_sp factorisation): the local tokens are the whole sequence, nothing to exchange.
    `core(fn, *args)` runs the core attention (model.CoreAttention.core: checkpointed under
    recompute=selective). The core is the exchange AND the kernel, as TransformerEngine's context-parallel
    attention under Megatron's selective recompute: the whole-sequence K/V are not kept for backward but
    exchanged again (docs/method.md#choice-recompute). Ulysses is not here (ops/ulysses.py): its all-to-alls stay
    outside the core (the head-sharded Q, K, V it keeps are the size of the local ones; docs/method.md#ulysses).
    """
    if comm is None:
        return core(attend_shard, q, k, v, layout)
    if variant == "ring":
        return core(ring_attention, q, k, v, comm, layout)
    if variant == "ulysses":  # its output exchange is fused with W_O (ops/ulysses.py): the module calls it
        raise ValueError("sp_variant=ulysses attends through schemes/ops/ulysses.py, not attend_sequence")
    return core(_allgather_attention, q, k, v, comm, layout)


def _allgather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, layout: SeqLayout):
    """One all-gather of the packed [K; V] (one message, as tsp), reduce-scatter of [dK; dV] backward; the gather
    is in rank order, unshard restores logical order."""
    n_kv = k.shape[1]
    kv = layout.unshard(gather_from_sequence(torch.cat([k, v], dim=1), comm, dim=2), dim=2)  # [B, 2·n_kv, S, d]
    return attend_shard(q, kv[:, :n_kv], kv[:, n_kv:], layout)

"""DeepSpeed-Ulysses attention for token-sharded ranks (`sp_variant=ulysses` of sp, and of tp_sp's Σ axis on its
n/T heads; docs/method.md#ulysses).

Jacobs et al. 2023 (arXiv:2309.14509), DeepSpeed `sequence/layer.py` DistributedAttention: instead of moving K/V
along the sequence, exchange heads. Every rank holds all heads of S/Σ tokens; one all-to-all turns that into
n/Σ heads of all S tokens, attention runs unchanged (plain causal attention over the whole sequence, each head
independent), and a second all-to-all turns the output back into token shards:

    in    pack [Q; K; V] per destination head group (one all-to-all of Σ blocks of S/Σ tokens × (n_q + 2·n_kv)/Σ
          heads) → (n_q + 2·n_kv)/Σ heads of all S tokens in rank order → un-zigzag (SeqLayout)
    core  causal attention of the n_q/Σ query heads against their n_kv/Σ K/V heads (GQA groups stay whole:
          query group j uses exactly K/V group j because both are split into Σ contiguous blocks)
    out   re-zigzag to rank order, all-to-all (rank j gets its S/Σ tokens of my heads) → [B, n_q, S/Σ, d]

Needs n_q and n_kv divisible by Σ (tp_sp: by T·Σ; config.validate_parallel). Communication per layer, received per rank
(N = B·S): forward (N/Σ)·(h + 2h/g)·(Σ−1)/Σ in + (N/Σ)·h·(Σ−1)/Σ out = (N/Σ)·(2h + 2h/g)·(Σ−1)/Σ; backward the
inverse all-to-alls of the gradients, the same. Independent of Σ's growth as 1/Σ, unlike the K/V all-gather's
2·N·(h/g)·(Σ−1)/Σ (docs/method.md#ulysses).

Recompute=selective re-runs only the kernel (with the un-/re-zigzag): its inputs, the head-sharded Q, K, V, are
the same bytes as the local ones the projections make, so keeping them costs what the all-gather variant keeps
for Q and the local K/V, and the all-to-alls are not replayed. Decode reuses the token-sharded K/V cache and
the sp decode merge (schemes/ops/decode.py): one new token has no sequence to exchange.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tspbench.model import causal_attention
from tspbench.schemes.comm import Comm, all_to_all
from tspbench.schemes.ops.layout import SeqLayout


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    comm: Comm,
    layout: SeqLayout,
    core: Callable = lambda fn, *args: fn(*args),
) -> torch.Tensor:
    """q: [B, n_q, S/Σ, d], k, v: [B, n_kv, S/Σ, d] in local zigzag order → [B, n_q, S/Σ, d], the same order.
    `core(fn, *args)` runs the kernel part (checkpointed under recompute=selective).

    Sequence-major buffers ([tokens, B, heads, d], DeepSpeed's [S, B, H, d]) make both all-to-alls scatter and
    gather dim 0, so the exchange itself copies nothing: one copy packs [Q; K; V] per destination, one un-zigzags,
    one re-zigzags the output, one puts it back in [B, S/Σ, n_q, d] order for W_O."""
    p, n_q, n_kv = comm.size, q.shape[1], k.shape[1]
    # [p, S/Σ, B, heads/p, d] per tensor; block j of dim 0 is rank j's heads of my tokens
    packed = torch.cat([t.permute(2, 0, 1, 3).unflatten(2, (p, -1)).movedim(2, 0) for t in (q, k, v)], dim=3)
    heads = all_to_all(packed.flatten(0, 1), comm, scatter_dim=0, gather_dim=0)  # [S, B, (n_q + 2·n_kv)/p, d]
    del packed
    o = core(_head_attention, heads, (n_q // p, n_kv // p, n_kv // p), layout)  # [S, B, n_q/p, d], rank order
    o = all_to_all(o, comm, scatter_dim=0, gather_dim=0)  # block j: head group j of my tokens
    b, s_loc = q.shape[0], q.shape[2]
    return o.unflatten(0, (p, s_loc)).permute(2, 1, 0, 3, 4).reshape(b, s_loc, n_q, -1).transpose(1, 2)


def _head_attention(heads: torch.Tensor, split: tuple[int, int, int], layout: SeqLayout) -> torch.Tensor:
    """Whole-sequence causal attention of this rank's heads. heads: [S, B, n_q/p + 2·n_kv/p, d] in rank (zigzag)
    order → [S, B, n_q/p, d] in rank order."""
    logical = layout.unshard(heads, dim=0)
    q, k, v = (t.permute(1, 2, 0, 3) for t in logical.split(split, dim=2))  # [B, heads/p, S, d] views
    o = causal_attention(q, k, v, 0)
    return layout.reshard(o.permute(2, 0, 1, 3), dim=0)

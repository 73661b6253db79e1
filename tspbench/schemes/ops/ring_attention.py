"""Ring attention over a zigzag token layout: a pure function of (q, k, v, comm, layout).

Each of the Σ ranks holds the queries, keys and values of its own tokens. K/V travel round the ring
(send to rank+1, receive from rank−1), so at step t rank p holds the K/V block of rank src = (p − t) mod Σ
and folds it into an online softmax (Milakov & Gimelshein 2018; Liu et al. 2023):

    s  = q·k_srcᵀ/√d, masked to pos_k ≤ pos_q with the *global* positions of both blocks
    m' = max(m, rowmax s);   α = exp(m − m');   P = exp(s − m')
    l  = α·l + rowsum P;     acc = α·acc + P·v_src;      o = acc / l   after Σ blocks

Step 0 is the rank's own block, which contains every query's own position, so every row has a finite
max from the start; later blocks may mask a row completely and then contribute exp(−∞) = 0.

Communication: Σ−1 hops, each one packed [K; V] shard of 2·B·(S/Σ)·(h/g) elements, i.e.
2·B·S·(h/g)·(Σ−1)/Σ received per rank forward, the same bytes as the K/V all-gather (docs/method.md#communication).
Backward: autograd sends each hop's gradient back along the reverse hop (`shift_ring`), the same volume;
the ring's sum of those partial dK/dV is what the all-gather's reduce-scatter computes.

This is a math kernel (one [S/Σ, S/Σ] score block at a time, no flash kernel, no overlap): the reference
for correctness and for the communication pattern, not for speed.
"""

from __future__ import annotations

import math

import torch

from tspbench.schemes.comm import Comm, shift_ring
from tspbench.schemes.ops.layout import SeqLayout


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, layout: SeqLayout) -> torch.Tensor:
    """Causal attention of this rank's queries against the whole sequence, K/V exchanged by ring hops.

    q: [B, n_q, S/Σ, d]; k, v: [B, n_kv, S/Σ, d], all in local (zigzag) order with n_q a multiple of n_kv
    (GQA). Returns [B, n_q, S/Σ, d] in local order, dtype of q.
    """
    g = q.shape[1] // k.shape[1]
    # Accumulate in fp64 for fp64 inputs (parity runs), otherwise fp32 (the flash-attention convention).
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf = q.to(acc_dtype) * (1.0 / math.sqrt(q.shape[-1]))
    pos_q = layout.positions  # [S/Σ] global positions, on the device
    m = q.new_full((*q.shape[:-1], 1), -math.inf, dtype=acc_dtype)  # [B, n_q, S/Σ, 1] running max
    l = torch.zeros_like(m)  # running denominator
    acc = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)  # [B, n_q, S/Σ, d] running numerator

    kv = torch.stack((k, v))  # [2, B, n_kv, S/Σ, d]: one message per hop, not two
    for step in range(comm.size):
        if step > 0:
            kv = shift_ring(kv, comm)  # now holds rank (p − step)'s block
        src = (comm.rank - step) % comm.size
        kb, vb = (t.to(acc_dtype).repeat_interleave(g, dim=1) for t in kv.unbind(0))  # [B, n_q, S/Σ, d]
        mask = layout.positions_of(src)[None, :] <= pos_q[:, None]  # [S/Σ q, S/Σ k]
        s = (qf @ kb.transpose(-1, -2)).masked_fill(~mask, -math.inf)  # [B, n_q, S/Σ, S/Σ]
        # The max is only a stabilising shift (o does not depend on it), so it carries no gradient;
        # detaching also keeps −∞ out of autograd for rows this block masks completely.
        m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)  # step 0: exp(−∞) = 0 wipes the empty initial state
        p = torch.exp(s - m_new)  # masked entries: exp(−∞) = 0
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        acc = alpha * acc + p @ vb
        m = m_new
    return (acc / l).to(q.dtype)

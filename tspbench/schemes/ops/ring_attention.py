"""Ring attention over a zigzag token layout with the flash kernels: a pure function of (q, k, v, comm, layout).

Each of the Σ ranks holds the queries, keys and values of its own tokens. The packed [K; V] block travels round the
ring (send to rank+1, receive from rank−1), so at step t rank p holds the block of rank src = (p − t) mod Σ. As in
`zhuzilin/ring-flash-attention:ring_flash_attn/zigzag_ring_flash_attn.py`, every (query chunk, key chunk) pair of
the zigzag layout (`SeqLayout.chunks_of`, equal-length chunks) is one flash-kernel call whose meaning is never
ambiguous (tspbench/attention.py):

    key chunk before the query chunk   unmasked block      attention_lse(causal=False)
    the same chunk                     square causal       attention_lse(causal=True)   (step 0 only)
    key chunk after the query chunk    skipped (fully masked)

and the partial outputs are merged by their log-sum-exp (`merge_lse`, fp32 accumulators; fp64 for parity runs).
Step 0 is the rank's own block, which holds every query chunk's diagonal, so every row has a finite log-sum-exp
from the start. Nothing [S/Σ, S/Σ] is materialised in Python.

Overlap: the hop that brings step t+1's block is posted BEFORE step t's kernels run and waited after them
(the overlap ring attention exists for; docs/method.md#choice-sp-variant).

Backward (one autograd Function): each pair's kernel backward runs with the MERGED output and log-sum-exp of
its rows (the flash identity of attention.py), dQ accumulates locally, and the partial [dK; dV] of the block
received at step t travels back along the reverse hops: from the last step down, rank p adds its partial for
block (p − t) to the accumulator arriving from p + 1 and passes it on to p − 1, so after Σ−1 reverse hops each
rank holds the sum of every rank's partials for its own block (the reduce-scatter the all-gather variant does).

Communication: Σ−1 hops of one packed [K; V] block of 2·B·(S/Σ)·(h/g) elements forward and Σ−1 hops of the
same size backward: exactly the all-gather variant's bytes (docs/method.md#communication).

Memory: the received blocks are kept for backward (2·B·S·(h/g) elements per layer, what the all-gather variant
keeps). ring-flash-attention instead sends K/V round the ring again in backward (activations O(S/Σ), twice the
backward traffic); under `recompute=selective` or `full` ours replays the forward exchange (the core is
checkpointed), so nothing whole-sequence outlives the layer there either.
"""

from __future__ import annotations

import torch

from tspbench.attention import attention_lse, attention_lse_backward, merge_lse
from tspbench.schemes.comm import Comm
from tspbench.schemes.ops.layout import SeqLayout

BEFORE, SAME, AFTER = "before", "same", "after"


def _relation(q_chunk: tuple[int, int], k_chunk: tuple[int, int]) -> str:
    """Where an equal-length key chunk lies relative to a query chunk (zigzag and contiguous chunks are aligned)."""
    (qs, n), (ks, nk) = q_chunk, k_chunk
    assert n == nk, (q_chunk, k_chunk)
    if ks == qs:
        return SAME
    return BEFORE if ks + nk <= qs else AFTER


def _pairs(layout: SeqLayout, src: int):
    """(query slice, key slice, causal) of every pair of this rank's query chunks and `src`'s key chunks that
    contributes (local offsets into the [.., S/Σ, d] tensors)."""
    out, qo = [], 0
    for qc in layout.chunks:
        ko = 0
        for kc in layout.chunks_of(src):
            rel = _relation(qc, kc)
            if rel != AFTER:
                out.append((slice(qo, qo + qc[1]), slice(ko, ko + kc[1]), rel == SAME))
            ko += kc[1]
        qo += qc[1]
    return out


class _RingFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, layout: SeqLayout):
        n_kv = k.shape[1]
        acc_dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 accumulators (fp64 in parity runs)
        o: dict[int, torch.Tensor] = {}  # query chunk start → merged output (acc dtype)
        lse: dict[int, torch.Tensor] = {}
        states: list[list[tuple]] = []
        blocks = []
        kv = torch.cat([k, v], dim=1).contiguous()  # [B, 2·n_kv, S/Σ, d]: one message per hop, not two
        name = f"ring_attn:{comm.log.tag}:fwd"
        for step in range(comm.size):
            pending = None
            if step < comm.size - 1:  # post the next hop before this step's kernels run
                pending = comm.start_shift(kv, torch.empty_like(kv), 1, label=f"{name}:hop{step + 1}")
            comm.log.event("compute", f"{name}:step{step}")
            src = (comm.rank - step) % comm.size
            step_states = []
            for qs, ks, causal in _pairs(layout, src):
                oi, li, *st = attention_lse(q[:, :, qs], kv[:, :n_kv, ks], kv[:, n_kv:, ks], causal)
                step_states.append(tuple(st))
                key = qs.start
                if key not in o:
                    o[key], lse[key] = oi.to(acc_dtype), li
                else:
                    o[key], lse[key] = merge_lse(o[key], lse[key], oi, li)
            states.append(step_states)
            blocks.append(kv)
            if pending is not None:
                kv = pending.wait()
        starts = sorted(o)
        out = torch.cat([o[s] for s in starts], dim=2).to(q.dtype)
        lse_all = torch.cat([lse[s] for s in starts], dim=2)
        ctx.save_for_backward(q, out, lse_all, *blocks)
        ctx.comm, ctx.layout, ctx.states, ctx.n_kv, ctx.tag = comm, layout, states, n_kv, comm.log.tag
        return out

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, out, lse, *blocks = ctx.saved_tensors
        comm, layout, n_kv = ctx.comm, ctx.layout, ctx.n_kv
        do = do.contiguous()
        dq = torch.zeros_like(q, dtype=torch.promote_types(q.dtype, torch.float32))
        incoming = None  # the accumulator for the block received at step t+1, arriving from rank + 1
        name = f"ring_attn:{ctx.tag}:bwd"
        with comm.log.scope(ctx.tag, backward=True):
            for step in reversed(range(comm.size)):
                comm.log.event("compute", f"{name}:step{step}")
                kv = blocks[step]
                dkv = torch.zeros(kv.shape, dtype=dq.dtype, device=kv.device)
                src = (comm.rank - step) % comm.size
                for (qs, ks, causal), st in zip(_pairs(layout, src), ctx.states[step], strict=True):
                    k, v = kv[:, :n_kv, ks], kv[:, n_kv:, ks]
                    dqi, dki, dvi = attention_lse_backward(
                        do[:, :, qs], q[:, :, qs], k, v, out[:, :, qs], lse[:, :, qs], st, causal
                    )
                    dq[:, :, qs] += dqi
                    dkv[:, :n_kv, ks] += dki
                    dkv[:, n_kv:, ks] += dvi
                if incoming is not None:
                    dkv += incoming.wait()
                if step > 0:  # the block came from rank − 1 at this step: its gradient goes back there
                    dkv = dkv.to(kv.dtype)
                    incoming = comm.start_shift(dkv, torch.empty_like(dkv), -1, label=f"{name}:hop{step}")
        dkv = dkv.to(kv.dtype)
        return dq.to(q.dtype), dkv[:, :n_kv], dkv[:, n_kv:], None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm, layout: SeqLayout) -> torch.Tensor:
    """Causal attention of this rank's queries against the whole sequence, K/V exchanged by ring hops.

    q: [B, n_q, S/Σ, d]; k, v: [B, n_kv, S/Σ, d], all in local (zigzag) order with n_q a multiple of n_kv
    (GQA). Returns [B, n_q, S/Σ, d] in local order, dtype of q.
    """
    return _RingFlashAttention.apply(q, k, v, comm, layout)

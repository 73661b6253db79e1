"""The weight ring TSP uses for every sharded weight that meets local tokens (the gated MLP, and with
vocab=ring the embedding and the LM head): each rank's shard travels p → p+1, double-buffered so the next
shard is in flight while the current one computes (docs/method.md#tsp-mlp).

    forward    `ring_forward`: D steps; at step t rank p holds shard (p − t) mod D; D − 1 hops of one shard.
    backward   `ring_backward`: the shards circulate again (when the gradient needs them) and a gradient
               accumulator travels one hop behind each shard, picking up every rank's partial gradient and
               landing, summed, on the shard's owner after D − 1 hops (a ring reduce-scatter): D − 1 weight
               hops (if any) + D − 1 gradient hops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tspbench.schemes.comm import Comm

WEIGHT_TAG, GRAD_TAG = 1, 2  # P2P tags: a weight hop and a gradient hop may be in flight together


def pack(ws: list[torch.Tensor]) -> torch.Tensor:
    """One flat buffer on the wire (fewer, larger messages)."""
    return torch.cat([w.reshape(-1) for w in ws])


def unpack(buf: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    out, off = [], 0
    for s in shapes:
        n = s.numel()
        out.append(buf[off : off + n].view(s))
        off += n
    return out


def ring_forward(comm: Comm, own: torch.Tensor, step: Callable[[int, torch.Tensor], None]) -> None:
    """Call step(owner, buf) for each of the D shards, buf = shard `owner` (flat), in ring order starting
    with this rank's own; the next shard's hop overlaps the current step."""
    buf = own
    for t in range(comm.size):
        reqs: list = []
        if t < comm.size - 1:
            nxt = torch.empty_like(buf)
            reqs = comm.start_shift(buf, nxt, tag=WEIGHT_TAG)
        step((comm.rank - t) % comm.size, buf)
        for q in reqs:
            q.wait()
        if reqs:
            buf = nxt


def ring_backward(
    comm: Comm, own: torch.Tensor | None, partial_grad: Callable[[int, torch.Tensor | None], torch.Tensor]
) -> torch.Tensor:
    """This rank's shard gradient, summed over every rank. partial_grad(owner, buf) returns this rank's flat
    partial gradient for shard `owner`; buf is that shard's weights when `own` (this rank's, flat) is given,
    else None (the gradient does not need the weights, e.g. an embedding lookup)."""
    buf = own
    own_grad: torch.Tensor | None = None
    acc_in: torch.Tensor | None = None
    acc_reqs: list = []
    keep: list[torch.Tensor] = []
    for t in range(comm.size):  # step t: this rank holds shard (rank − t) mod D
        w_reqs: list = []
        nxt = None
        if buf is not None and t < comm.size - 1:
            nxt = torch.empty_like(buf)
            w_reqs = comm.start_shift(buf, nxt, tag=WEIGHT_TAG)
        g = partial_grad((comm.rank - t) % comm.size, buf)
        for q in acc_reqs:  # the accumulator for this shard, from rank − 1
            q.wait()
        if t == 0:
            own_grad = g  # own shard: keep, the others' partials arrive last
        else:
            if acc_in is not None:
                g = g + acc_in
            acc_in = torch.empty_like(g)  # pass it on (the last hop lands on the owner)
            acc_reqs, keep = comm.start_shift(g, acc_in, tag=GRAD_TAG), [g]
        for q in w_reqs:
            q.wait()
        buf = nxt if w_reqs else buf
    for q in acc_reqs:
        q.wait()
    del keep
    assert own_grad is not None
    if acc_in is not None:  # D ≥ 2: everyone else's partials for my shard
        own_grad = own_grad + acc_in
    return own_grad

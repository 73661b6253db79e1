"""The weight ring TSP uses for every sharded weight that meets local tokens (the gated MLP, and with vocab=ring
the embedding and the LM head): each rank's shard travels p → p+1, double-buffered so the next shard is in
flight while the current one computes (docs/method.md#tsp-mlp, #choice-ring).

    forward    `ring_forward`: D steps; at step t rank p holds shard (p − t) mod D; D − 1 hops of one shard.
               The hop that brings step t+1's shard is posted BEFORE step t computes (the overlap the method
               promises) and waited after it.
    backward   `ring_backward`: the shards circulate again (when the gradient needs them) and a gradient
               accumulator travels one hop behind each shard, picking up every rank's partial gradient and
               landing, summed, on the shard's owner after D − 1 hops (a ring reduce-scatter): D − 1 weight
               hops (if any) + D − 1 gradient hops.

Buffers. A rank's own shard is sent straight from the parameters' packed storage (TSP packs each layer's
shard once, and the parameters are views of it: nothing is re-packed per call). The shards in flight land in
two persistent buffers (`RingBuffers`), allocated once and shared by every layer and step (one layer's ring
ends before the next one starts); the gradient ring has two more. So at the peak a rank holds its own shard
and two received ones, never a fresh allocation per hop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tspbench.schemes.comm import Comm

WEIGHT_TAG, GRAD_TAG = 1, 2  # P2P tags: a weight hop and a gradient hop may be in flight together


class RingBuffers:
    """Persistent receive buffers of one shard size: two for weights in flight, two for gradient accumulators."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, list[torch.Tensor]] = {}

    def get(self, kind: str, like: torch.Tensor) -> list[torch.Tensor]:
        key = (kind, like.numel(), like.dtype, like.device)
        if key not in self._bufs:
            self._bufs[key] = [torch.empty(like.numel(), dtype=like.dtype, device=like.device) for _ in range(2)]
        return self._bufs[key]


def pack(ws: list[torch.Tensor]) -> torch.Tensor:
    """One flat buffer (fewer, larger messages)."""
    return torch.cat([w.reshape(-1) for w in ws])


def unpack(buf: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    out, off = [], 0
    for s in shapes:
        n = s.numel()
        out.append(buf[off : off + n].view(s))
        off += n
    return out


def ring_forward(
    comm: Comm,
    own: torch.Tensor,
    step: Callable[[int, torch.Tensor], None],
    bufs: RingBuffers | None = None,
    label: str = "ring",
) -> None:
    """Call step(owner, buf) for each of the D shards, buf = shard `owner` (flat), in ring order starting
    with this rank's own; the next shard's hop is posted before the current step computes. `bufs`: the
    persistent receive buffers (a fresh pool when None)."""
    buf, pool = own, (bufs or RingBuffers()).get("weights", own)
    for t in range(comm.size):
        pending = None
        if t < comm.size - 1:
            nxt = pool[t % 2]
            pending = comm.start_shift(buf, nxt, tag=WEIGHT_TAG, label=f"{label}:hop{t + 1}")
        comm.log.event("compute", f"{label}:step{t}")
        step((comm.rank - t) % comm.size, buf)
        if pending is not None:
            buf = pending.wait()


def ring_backward(
    comm: Comm,
    own: torch.Tensor | None,
    partial_grad: Callable[[int, torch.Tensor | None], torch.Tensor],
    bufs: RingBuffers | None = None,
    label: str = "ring",
) -> torch.Tensor:
    """This rank's shard gradient, summed over every rank. partial_grad(owner, buf) returns this rank's flat
    partial gradient for shard `owner`; buf is that shard's weights when `own` (this rank's, flat) is given,
    else None (the gradient does not need the weights, e.g. an embedding lookup)."""
    bufs = bufs or RingBuffers()
    wpool = bufs.get("weights", own) if own is not None else None
    buf = own
    own_grad: torch.Tensor | None = None
    incoming = None  # the accumulator for the shard this rank handles next, arriving from rank − 1
    for t in range(comm.size):  # step t: this rank holds shard (rank − t) mod D
        w_pending = None
        if buf is not None and wpool is not None and t < comm.size - 1:
            w_pending = comm.start_shift(buf, wpool[t % 2], tag=WEIGHT_TAG, label=f"{label}:bwd_hop{t + 1}")
        comm.log.event("compute", f"{label}:bwd_step{t}")
        g = partial_grad((comm.rank - t) % comm.size, buf)
        if t == 0:
            own_grad = g  # own shard: keep, the others' partials arrive last
        else:
            if incoming is not None:
                g = g + incoming.wait()
            # pass it on: the last hop (t = D − 1) lands on the owner
            incoming = comm.start_shift(g, bufs.get("grads", g)[t % 2], tag=GRAD_TAG, label=f"{label}:grad_hop{t}")
        if w_pending is not None:
            buf = w_pending.wait()
    assert own_grad is not None
    if incoming is not None:  # D ≥ 2: everyone else's partials for my shard
        own_grad = own_grad + incoming.wait()
    return own_grad

"""How TSP's sharded weights reach the tokens: the weight ring for every sharded weight that meets local tokens (the
gated MLP, and with vocab=ring the embedding and the LM head), and the MLP's two alternatives, `mlp_exchange=biring`
and `mlp_exchange=broadcast` (docs/method.md#tsp-mlp, #choice-ring).

    ring       `ring_forward`: D steps; at step t rank p holds shard (p − t) mod D; D − 1 hops of one shard, p → p+1.
               The hop that brings step t+1's shard is posted BEFORE step t computes (the overlap the method
               promises) and waited after it.
               `ring_backward`: the shards circulate again (when the gradient needs them) and a gradient
               accumulator travels one hop behind each shard, picking up every rank's partial gradient and
               landing, summed, on the shard's owner after D − 1 hops (a ring reduce-scatter): D − 1 weight
               hops (if any) + D − 1 gradient hops.
    biring     `rings_forward` / `rings_backward` with both directions (CW, CCW): each shard is cut in two pieces
               (halves of its channels); piece 0 goes p → p+1 (at step t rank p holds piece 0 of shard (p − t)),
               piece 1 goes p → p−1 (piece 1 of shard (p + t)). Both hops of a step are posted in ONE batch before the
               step's two pieces compute and waited after them, so both directions of every link carry half a
               shard per step at once (at D = 2 the two directions are one link: both pieces cross it). Backward:
               each piece's gradient accumulator travels behind it, in its direction; the weight pair, then the
               gradient pair, each one batch. D − 1 hops each way, of half a shard.
    broadcast  `broadcast_forward` / `broadcast_backward`: each owner's shard broadcast in turn, owner r+1's posted
               before owner r's shard computes (double-buffered, as attention's weights,
               schemes/ops/owner_attention.py); backward re-broadcasts and reduces each shard's gradient to its
               owner asynchronously into one of two gradient buffers. D broadcasts (+ D reduces backward).

Buffers. A rank's own shard is sent straight from the packed copy of its parameters. The shards in flight land
in persistent buffers (`RingBuffers`), allocated once and shared by every layer and step (one layer's exchange
ends before the next one starts): two per direction for weights, two for gradient accumulators (or, broadcast,
the gradients being reduced). So at the peak a rank holds its own shard and two received ones, never a fresh
allocation per hop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tspbench.schemes.comm import Comm, Pending


@dataclass(frozen=True)
class Direction:
    """One way round the ring: where a rank sends (rank + offset), the P2P tags of its weight and gradient hops
    (distinct per direction, so the four kinds of hop may be in flight together, even at D = 2 where both
    directions join the same two ranks), and the prefix of its hops' labels."""

    offset: int
    weight_tag: int
    grad_tag: int
    prefix: str
    weights: str  # the RingBuffers kinds of its weight and gradient receive buffers
    grads: str


CW = Direction(+1, 1, 2, "", "weights", "grads")  # send to p+1, receive from p−1 (the ring's direction)
CCW = Direction(-1, 3, 4, "ccw_", "weights_ccw", "grads_ccw")  # send to p−1, receive from p+1
WEIGHT_TAG, GRAD_TAG = CW.weight_tag, CW.grad_tag  # P2P tags: a weight hop and a gradient hop may be in flight together


class RingBuffers:
    """Persistent receive buffers of one shard size: `count` (two) per kind — weights in flight per direction,
    gradient accumulators, the broadcast shards (three for attention's pipelined owner loop)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, list[torch.Tensor]] = {}

    def get(self, kind: str, like: torch.Tensor, count: int = 2) -> list[torch.Tensor]:
        key = (kind, like.numel(), like.dtype, like.device)
        if key not in self._bufs:
            self._bufs[key] = [torch.empty(like.numel(), dtype=like.dtype, device=like.device) for _ in range(count)]
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
    rings_forward(comm, [own], lambda owner, _piece, buf: step(owner, buf), bufs, label, (CW,))


def rings_forward(
    comm: Comm,
    owns: Sequence[torch.Tensor],
    step: Callable[[int, int, torch.Tensor], None],
    bufs: RingBuffers | None = None,
    label: str = "ring",
    directions: Sequence[Direction] = (CW,),
) -> None:
    """Piece i of every shard travels round the ring in directions[i] (owns[i]: this rank's piece i, flat). At
    step t call step(owner, i, buf) for each piece, buf = piece i of shard `owner` = (rank − offset·t) mod D; every
    direction's next hop is posted before the step computes and waited after it."""
    pool = bufs or RingBuffers()
    pools = [pool.get(d.weights, own) for d, own in zip(directions, owns)]
    cur = list(owns)
    for t in range(comm.size):
        pending: list[Pending | None] = [None] * len(cur)
        if t < comm.size - 1:  # every direction's hop in one batch: they run together (docs/method.md#gpu-review)
            hops = [
                (cur[i], pools[i][t % 2], d.offset, d.weight_tag, f"{label}:{d.prefix}hop{t + 1}")
                for i, d in enumerate(directions)
            ]
            pending = [*comm.start_shifts(hops)]
        comm.log.event("compute", f"{label}:step{t}")
        for i, d in enumerate(directions):
            step((comm.rank - d.offset * t) % comm.size, i, cur[i])
        for i, p in enumerate(pending):
            if p is not None:
                cur[i] = p.wait()


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
    (grad,) = rings_backward(comm, [own], lambda owner, _piece, buf: partial_grad(owner, buf), bufs, label, (CW,))
    return grad


def rings_backward(
    comm: Comm,
    owns: Sequence[torch.Tensor | None],
    partial_grad: Callable[[int, int, torch.Tensor | None], torch.Tensor],
    bufs: RingBuffers | None = None,
    label: str = "ring",
    directions: Sequence[Direction] = (CW,),
) -> list[torch.Tensor]:
    """This rank's gradient of each of its pieces, summed over every rank: piece i's weights travel directions[i]
    again (when owns[i] is given) with a gradient accumulator one hop behind, in the same direction, that lands on
    the owner after D − 1 hops. partial_grad(owner, i, buf) is this rank's flat partial gradient of piece i of
    shard `owner` (buf: its weights, or None)."""
    pool = bufs or RingBuffers()
    wpools = [pool.get(d.weights, own) if own is not None else None for d, own in zip(directions, owns)]
    cur = list(owns)
    own_grads: list[torch.Tensor | None] = [None] * len(cur)
    incoming: list[Pending | None] = [None] * len(cur)  # the accumulator for the piece handled next
    for t in range(comm.size):  # step t: piece i of shard (rank − offset·t) mod D
        w_pending: list[Pending | None] = [None] * len(cur)
        hops: list[tuple[torch.Tensor, torch.Tensor, int, int, str]] = []
        moving: list[int] = []
        if t < comm.size - 1:  # the weight pair in one batch
            for i, d in enumerate(directions):
                buf, wpool = cur[i], wpools[i]
                if buf is not None and wpool is not None:
                    moving.append(i)
                    hops.append((buf, wpool[t % 2], d.offset, d.weight_tag, f"{label}:{d.prefix}bwd_hop{t + 1}"))
        for i, posted in zip(moving, comm.start_shifts(hops) if hops else []):
            w_pending[i] = posted
        comm.log.event("compute", f"{label}:bwd_step{t}")
        grads: list[torch.Tensor] = []
        for i, d in enumerate(directions):
            g = partial_grad((comm.rank - d.offset * t) % comm.size, i, cur[i])
            if t == 0:
                own_grads[i] = g  # own piece: keep, the others' partials arrive last
                continue
            arrived = incoming[i]
            grads.append(g + arrived.wait() if arrived is not None else g)
        if t > 0:  # then the gradient pair in one batch, one hop behind the weights: hop D − 1 lands on the owner
            grad_hops = [
                (g, pool.get(d.grads, g)[t % 2], d.offset, d.grad_tag, f"{label}:{d.prefix}grad_hop{t}")
                for g, d in zip(grads, directions)
            ]
            incoming = [*comm.start_shifts(grad_hops)]
        for i, p in enumerate(w_pending):
            if p is not None:
                cur[i] = p.wait()
    out: list[torch.Tensor] = []
    for mine, arrived in zip(own_grads, incoming):
        assert mine is not None
        out.append(mine + arrived.wait() if arrived is not None else mine)  # D ≥ 2: everyone else's partials
    return out


def _broadcast_shard(comm: Comm, own: torch.Tensor, pool: list[torch.Tensor], owner: int, label: str) -> Pending:
    """Post the broadcast of `owner`'s shard: the owner sends its own packed shard, the others receive into
    pool[owner % 2]."""
    buf = own if owner == comm.rank else pool[owner % 2]
    return comm.start_broadcast(buf, owner, label=label)


def broadcast_forward(
    comm: Comm,
    own: torch.Tensor,
    step: Callable[[int, torch.Tensor], None],
    bufs: RingBuffers | None = None,
    label: str = "broadcast",
) -> None:
    """Call step(r, buf) for owner r = 0 … D−1, buf = shard r broadcast from its owner; owner r+1's broadcast is
    posted before step r computes and waited after it (two receive buffers)."""
    pool = (bufs or RingBuffers()).get("weights", own)
    pending = _broadcast_shard(comm, own, pool, 0, f"{label}:bcast0")
    for r in range(comm.size):
        buf = pending.wait()
        if r + 1 < comm.size:
            pending = _broadcast_shard(comm, own, pool, r + 1, f"{label}:bcast{r + 1}")
        comm.log.event("compute", f"{label}:step{r}")
        step(r, buf)


def broadcast_backward(
    comm: Comm,
    own: torch.Tensor,
    partial_grad: Callable[[int, torch.Tensor], torch.Tensor],
    bufs: RingBuffers | None = None,
    label: str = "broadcast",
) -> torch.Tensor:
    """This rank's shard gradient, summed over every rank: each shard is broadcast again (owner r+1's in flight
    while r's partial gradient is computed) and this rank's partial gradient of shard r is reduced to owner r
    asynchronously, into one of two gradient buffers, waited when that buffer is needed again."""
    pool = (bufs or RingBuffers()).get("weights", own)
    grads = (bufs or RingBuffers()).get("reduce_grads", own)
    reduces: list[tuple[int, Pending] | None] = [None, None]
    own_grad: torch.Tensor | None = None

    def finish(slot: int) -> None:
        nonlocal own_grad
        pend = reduces[slot]
        if pend is not None:
            got = pend[1].wait()
            if pend[0] == comm.rank:
                own_grad = got.clone()  # the buffer is reused by a later owner's reduce
            reduces[slot] = None

    pending = _broadcast_shard(comm, own, pool, 0, f"{label}:bwd_bcast0")
    for r in range(comm.size):
        buf = pending.wait()
        if r + 1 < comm.size:
            pending = _broadcast_shard(comm, own, pool, r + 1, f"{label}:bwd_bcast{r + 1}")
        comm.log.event("compute", f"{label}:bwd_step{r}")
        g = partial_grad(r, buf)
        slot = r % 2
        finish(slot)  # this gradient buffer's previous reduce must be done before it is rewritten
        grads[slot].copy_(g)
        reduces[slot] = (r, comm.start_reduce(grads[slot], r, label=f"{label}:reduce{r}"))
    finish(0)
    finish(1)
    assert own_grad is not None
    return own_grad

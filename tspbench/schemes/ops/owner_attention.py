"""TSP attention as one autograd Function whose schedule is on the page (docs/method.md#tsp-attention,
#tsp-backward, #choice-recompute).

Rank p holds its tokens x [B, n, h] (n = S/D, zigzag) and owner shard p of W_Q, W_K, W_V, W_O (packed once per
call into one flat buffer, the message a broadcast sends). Forward, pipelined across owners:

    post broadcast(shard 0);  W_0 = wait(broadcast 0);  post broadcast(1)
    q, k, v = project(x, W_0);  post all_gather(owner 0, bucket 0)
    for owner r = 0 … D−1:
        if r + 1 < D:                                              owner r+1 first, so its gather is in flight
            W_{r+1} = wait(broadcast r+1);  post broadcast(r + 2)  while owner r computes
            q', k', v' = RoPE(x·W_Q,r+1ᵀ), RoPE(x·W_K,r+1ᵀ), x·W_V,r+1ᵀ   owner r+1's heads, my tokens
            post all_gather(owner r+1, bucket 0 of [k'; v'])
        for head bucket b of owner r:                              `kv_bucket_heads` KV heads per all-gather
            K, V = wait(gather r, b);  post all_gather(r, b + 1)   the next bucket is in flight during b
            o_b, lse_b = causal attention of my two query chunks against the whole sequence (tspbench/attention.py)
        y += o·W_O,rᵀ                                              my tokens only: no all-reduce
    kept per owner: q, the local k and v, o and its log-sum-exp — 1/D of what the single device keeps; the
    gathered K/V (the whole sequence) are dropped as soon as the bucket is done (regather_kv=False: kept too).
Backward (dy), no recomputed GEMM or kernel forward:
    post re-gather(owner 0, bucket 0)                              (regather_kv=False: none, the kept K/V are used)
    post broadcast(shard 0)                                        a rank never keeps another owner's weights
    for owner r: W_r = wait(broadcast r); post broadcast(r + 1)
        do = dy·W_Or;  post re-gather(owner r+1, bucket 0)        in flight during owner r's attention backward
        per bucket: K, V = wait(re-gather r, b); post re-gather(r, b + 1)   communication only (#choice-backward)
                    dq, dK, dV = attention backward (from the kept o and log-sum-exp)
                    post reduce_scatter([dK; dV]) → my tokens' dk, dv
        dW_O = dyᵀ·o;  dx += dq·W_Qr + dk·W_Kr + dv·W_Vr;  dW_Q, dW_K, dW_V = (dq, dk, dv)ᵀ·x
        post reduce([dW_Q, dW_K, dW_V, dW_O] → owner r)           waited when its buffer is needed again
Buffers: three receive buffers for broadcast shards (owner r's, whose W_O is still to be applied, r+1's, projected,
and r+2's in flight) and two for the packed gradient being reduced, shared by every layer (`RingBuffers`); per
owner step one bucket's gathered K/V, the next one in flight and the next owner's first bucket in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tspbench.attention import chunk_backward, chunk_forward
from tspbench.config import Rope
from tspbench.model import apply_rope
from tspbench.schemes.comm import Comm, Pending
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.ring import pack, unpack


@dataclass
class OwnerPlan:
    """Everything the owner loop needs besides the tensors; one per layer (tag), buffers shared by layers."""

    comm: Comm
    layout: SeqLayout
    own: torch.Tensor | None  # this rank's packed [W_Q; W_K; W_V; W_O] shard (the parameters are views of it)
    shapes: list[torch.Size]
    head_dim: int
    theta: float | Rope
    kv_bucket_heads: int  # KV heads per all-gather; 0: all of an owner's KV heads in one
    tag: str = ""
    recv: list[torch.Tensor] = field(default_factory=list)  # three shard buffers (r's, r+1's, r+2's in flight)
    grads: list[torch.Tensor] = field(default_factory=list)  # two packed-gradient buffers (async reduce)
    regather_kv: bool = True  # backward re-gathers K/V (True) or uses the ones the forward (or replay) kept

    def broadcast(self, owner: int, phase: str):
        """Post the broadcast of `owner`'s shard: the owner sends straight from its packed parameters."""
        buf = self.own if owner == self.comm.rank else self.recv[owner % len(self.recv)]
        assert buf is not None
        return self.comm.start_broadcast(buf, owner, label=f"broadcast:{self.tag}:{phase}:owner{owner}")

    def buckets(self, n_kv: int) -> list[tuple[int, int]]:
        size = self.kv_bucket_heads or n_kv
        return [(b, min(b + size, n_kv)) for b in range(0, n_kv, size)]

    def gather(self, k: torch.Tensor, v: torch.Tensor, lo: int, hi: int, label: str):
        """Post the all-gather of KV heads lo … hi−1 of [k; v] along the sequence (tokens moved first)."""
        kv = torch.cat([k[:, lo:hi], v[:, lo:hi]], 1).movedim(2, 0)  # [n, B, 2·nb, d]
        return self.comm.start_all_gather(kv, label=label)

    def shards(self, phase: str):
        """Every owner's shard in turn: (r, W_Q, W_K, W_V, W_O), owner r+1's broadcast posted before owner r's shard
        is handed out (so it is in flight while r computes; the forward takes r+1's shard before r's attention runs,
        so r+2's is the one in flight then: three receive buffers)."""
        pending = self.broadcast(0, phase)
        for r in range(self.comm.size):
            w = pending.wait()
            if r + 1 < self.comm.size:
                pending = self.broadcast(r + 1, phase)
            yield (r, *unpack(w, self.shapes))

    def start_gather(self, k: torch.Tensor, v: torch.Tensor, phase: str, owner: int) -> Pending:
        """Post the all-gather of owner `owner`'s first head bucket (the pipeline posts it one owner early)."""
        lo, hi = self.buckets(k.shape[1])[0]
        return self.gather(k, v, lo, hi, f"all_gather:{self.tag}:{phase}:owner{owner}:bucket0")

    def gathered(self, k: torch.Tensor, v: torch.Tensor, phase: str, owner: int, first: Pending | None = None):
        """Owner `owner`'s K/V over the whole sequence, a head bucket at a time: (i, lo, hi, K, V) in logical order,
        bucket i+1's all-gather posted before bucket i is handed out; the compute mark follows in the log. `first`:
        bucket 0's all-gather, already posted (`start_gather`); None posts it here."""
        buckets = self.buckets(k.shape[1])
        label = f"{self.tag}:{phase}:owner{owner}"
        gathering = first if first is not None else self.gather(k, v, *buckets[0], f"all_gather:{label}:bucket0")
        del first  # only `gathering` holds a bucket's buffer, so it is freed when the next bucket is posted
        for i, (lo, hi) in enumerate(buckets):
            kk, vv = self.logical(gathering.wait())
            if i + 1 < len(buckets):
                gathering = self.gather(k, v, *buckets[i + 1], f"all_gather:{label}:bucket{i + 1}")
            self.comm.log.event("compute", f"attention:{label}:bucket{i}")
            yield i, lo, hi, kk, vv

    def kept(self, kv: list[tuple[torch.Tensor, torch.Tensor]], n_kv: int, phase: str, owner: int):
        """regather_kv=False: owner `owner`'s K/V as the forward (or the full-recompute replay) gathered them, bucket
        by bucket as `gathered` hands them out, with no collective."""
        label = f"{self.tag}:{phase}:owner{owner}"
        for i, ((lo, hi), (kk, vv)) in enumerate(zip(self.buckets(n_kv), kv, strict=True)):
            self.comm.log.event("compute", f"attention:{label}:bucket{i}")
            yield i, lo, hi, kk, vv

    def logical(self, gathered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[S (rank order), B, 2·nb, d] → K, V [B, nb, S, d] in logical order."""
        kv = self.layout.unshard(gathered, dim=0).movedim(0, 2)
        nb = kv.shape[1] // 2
        return kv[:, :nb], kv[:, nb:]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: SeqLayout):
    """My query chunks (local order) against the whole sequence: o [B, H, n, d], lse [B, H, n], kernel states."""
    outs, lses, states, lo = [], [], [], 0
    for start, n in layout.chunks:
        end = start + n
        o, lse, st = chunk_forward(q[:, :, lo : lo + n], k[:, :, :end], v[:, :, :end], start)
        outs.append(o)
        lses.append(lse)
        states.append(st)
        lo += n
    return torch.cat(outs, 2), torch.cat(lses, 2), states


def _attend_backward(do, q, k, v, o, lse, states, layout: SeqLayout):
    """dq [B, H, n, d] and dK, dV [B, Hk, S, d] of `_attend` (both chunks' key ranges overlap: summed)."""
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    lo = 0
    for (start, n), st in zip(layout.chunks, states):
        end, sl = start + n, slice(lo, lo + n)
        gq, gk, gv = chunk_backward(
            do[:, :, sl], q[:, :, sl], k[:, :, :end], v[:, :, :end], o[:, :, sl], lse[:, :, sl], start, st
        )
        dq[:, :, sl] = gq
        dk[:, :, :end] += gk
        dv[:, :, :end] += gv
        lo += n
    return dq, dk, dv


def _project(x, wq, wk, wv, cos, sin, head_dim):
    """q, k (after RoPE), v [B, heads, n, d] of one owner's heads for my tokens."""
    b, n, _ = x.shape
    q = apply_rope(F.linear(x, wq).view(b, n, -1, head_dim), cos, sin).transpose(1, 2)
    k = apply_rope(F.linear(x, wk).view(b, n, -1, head_dim), cos, sin).transpose(1, 2)
    v = F.linear(x, wv).view(b, n, -1, head_dim).transpose(1, 2)
    return q, k, v


def owner_loop(
    x: torch.Tensor, plan: OwnerPlan, cos: torch.Tensor, sin: torch.Tensor, on_kv=None, keep_kv: bool = False
):
    """The forward schedule (module docstring), pipelined: owner r+1's shard, projections and first K/V bucket are
    posted before owner r's attention. Returns y and, per owner, what backward needs: (q, k, v, o, lse, kernel
    states per bucket, the gathered (K, V) per bucket when `keep_kv` else None). `on_kv(k, v)` sees each owner's
    local k, v in owner order (the serving prefill caches them)."""
    y, saved = torch.zeros_like(x), []
    shards = plan.shards("fwd")

    def start(r: int, wq, wk, wv, wo):
        """Owner r's projections and the all-gather of its first K/V bucket, posted."""
        q, k, v = _project(x, wq, wk, wv, cos, sin, plan.head_dim)
        if on_kv is not None:
            on_kv(k, v)
        return r, wo, q, k, v, plan.start_gather(k, v, "fwd", r)

    nxt = start(*next(shards))
    for _ in range(plan.comm.size):
        assert nxt is not None
        r, wo, q, k, v, first = nxt
        # owner r+1 before owner r's attention: its first bucket's gather is in flight during it
        nxt = start(*next(shards)) if r + 1 < plan.comm.size else None
        g = q.shape[1] // k.shape[1]
        outs, lses, states, kept = [], [], [], []
        buckets = plan.gathered(k, v, "fwd", r, first)
        del first  # (the generator holds it now: bucket 0's buffer is freed with it)
        for _i, lo, hi, kk, vv in buckets:
            o_b, lse_b, st = _attend(q[:, lo * g : hi * g], kk, vv, plan.layout)
            outs.append(o_b)
            lses.append(lse_b)
            states.append(st)
            if keep_kv:
                kept.append((kk, vv))
            del kk, vv  # the whole sequence's K/V of this bucket: dropped before the next bucket arrives
        o = torch.cat(outs, 1) if len(outs) > 1 else outs[0]  # [B, H_r, n, d]
        y += F.linear(o.transpose(1, 2).flatten(2), wo)
        lse = torch.cat(lses, 1) if len(lses) > 1 else lses[0]
        saved.append((q, k, v, o, lse, states, kept if keep_kv else None))
    shards.close()
    return y, saved


def _kept_kv(saved: list, owner: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (K, V) per bucket the forward kept for owner `owner` (regather_kv=False)."""
    return saved[owner][6]


class OwnerAttention(torch.autograd.Function):
    """y = Σ_r attention(x; owner r's shard). Inputs: x and this rank's own shard parameters, so autograd
    returns the owner's reduced weight gradients to them."""

    @staticmethod
    def forward(ctx, x, wq, wk, wv, wo, plan: OwnerPlan, cos, sin):
        y, saved = owner_loop(x, plan, cos, sin, keep_kv=not plan.regather_kv)
        plan.own = None  # the packed copy of my shard is not kept for backward: re-packed there
        # through save_for_backward (not ctx attributes), so recompute=full's checkpoint can drop and rebuild them
        # (regather_kv=False under full recompute: the replay's gathered K/V are the ones backward uses)
        ctx.plan, ctx.states = plan, [per_owner[5] for per_owner in saved]
        kept = [t for per_owner in saved for kv in per_owner[6] or [] for t in kv]
        ctx.save_for_backward(x, cos, sin, wq, wk, wv, wo, *[t for per_owner in saved for t in per_owner[:5]], *kept)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, cos, sin, wq, wk, wv, wo, *flat = ctx.saved_tensors
        plan: OwnerPlan = ctx.plan
        plan.own = pack([wq, wk, wv, wo])
        d = len(ctx.states)
        owners, kept = flat[: 5 * d], flat[5 * d :]
        per = len(kept) // (2 * d)  # kept buckets per owner (0: regather_kv)
        saved = [
            (
                *owners[5 * r : 5 * r + 5],
                st,
                [(kept[2 * (r * per + i)], kept[2 * (r * per + i) + 1]) for i in range(per)] if per else None,
            )
            for r, st in enumerate(ctx.states)
        ]
        with plan.comm.log.scope(plan.tag, backward=True):
            dx, own_grad = _owner_backward(dy.contiguous(), x, cos, sin, plan, saved)
        del saved, flat, owners, kept
        plan.own = None
        return (dx, *unpack(own_grad, plan.shapes), None, None, None)


def _owner_backward(dy, x, cos, sin, plan: OwnerPlan, saved):
    """The backward schedule (module docstring): dx and this rank's own shard's packed gradient."""
    comm, d = plan.comm, plan.head_dim
    b, n, h = x.shape
    x2, dy2 = x.reshape(b * n, h), dy.reshape(b * n, h)
    dx2 = torch.zeros_like(x2)
    reduces: list = [None, None]  # (owner, Pending) per gradient buffer
    own_grad = None

    def finish(slot: int) -> None:
        nonlocal own_grad
        if reduces[slot] is not None:
            owner, pend = reduces[slot]
            got = pend.wait()
            if owner == comm.rank:
                own_grad = got.clone()  # the buffer is reused by the next owner's reduce
            reduces[slot] = None

    first = plan.start_gather(saved[0][1], saved[0][2], "bwd", 0) if plan.regather_kv else None
    for r, wq, wk, wv, wo in plan.shards("bwd"):
        q, k, v, o, lse, states, _ = saved[r]
        n_kv = k.shape[1]
        g = q.shape[1] // n_kv
        do = F.linear(dy, wo.t()).view(b, n, -1, d).transpose(1, 2)  # [B, H_r, n, d]
        dq = torch.empty_like(q)
        scatters = []
        if plan.regather_kv:  # owner r+1's first bucket re-gathered while owner r's attention backward runs
            nxt = plan.start_gather(saved[r + 1][1], saved[r + 1][2], "bwd", r + 1) if r + 1 < comm.size else None
            buckets = plan.gathered(k, v, "bwd", r, first)
            first = nxt
        else:  # the K/V the forward (or the full-recompute replay) gathered: no collective
            buckets = plan.kept(_kept_kv(saved, r), n_kv, "bwd", r)
        for i, lo, hi, kk, vv in buckets:
            hq = slice(lo * g, hi * g)
            dq[:, hq], dkk, dvv = _attend_backward(
                do[:, hq], q[:, hq], kk, vv, o[:, hq], lse[:, hq], states[i], plan.layout
            )
            del kk, vv
            dkv = plan.layout.reshard(torch.cat([dkk, dvv], 1), dim=2).movedim(2, 0)  # [S rank order, B, 2nb, d]
            del dkk, dvv
            scatters.append(
                (lo, hi, comm.start_reduce_scatter(dkv, f"reduce_scatter:{plan.tag}:bwd:owner{r}:bucket{i}"))
            )
        dwo = dy2.t() @ o.transpose(1, 2).reshape(b * n, -1)  # [h, H_r·d], while the scatters are in flight
        dk_loc = torch.empty((b, n_kv, n, d), dtype=x.dtype, device=x.device)
        dv_loc = torch.empty_like(dk_loc)
        for lo, hi, pend in scatters:  # waited here, where my tokens' dk, dv are used
            dkv = pend.wait().movedim(0, 2)  # [B, 2nb, n, d]
            dk_loc[:, lo:hi], dv_loc[:, lo:hi] = dkv[:, : hi - lo], dkv[:, hi - lo :]
        dq2 = apply_rope(dq.transpose(1, 2), cos, -sin).reshape(b * n, -1)  # RoPE is a rotation: Rᵀ = R(−θ)
        dk2 = apply_rope(dk_loc.transpose(1, 2), cos, -sin).reshape(b * n, -1)
        dv2 = dv_loc.transpose(1, 2).reshape(b * n, -1)
        dx2 += dq2 @ wq + dk2 @ wk + dv2 @ wv
        slot = r % 2
        finish(slot)  # this gradient buffer's previous reduce must be done before it is rewritten
        buf = plan.grads[slot]
        torch.cat(
            [(dq2.t() @ x2).reshape(-1), (dk2.t() @ x2).reshape(-1), (dv2.t() @ x2).reshape(-1), dwo.reshape(-1)],
            out=buf,
        )
        reduces[slot] = (r, comm.start_reduce(buf, r, f"reduce:{plan.tag}:bwd:owner{r}"))
    finish(0)
    finish(1)
    assert own_grad is not None
    return dx2.view_as(x), own_grad

"""The communication vocabulary: named autograd collectives (Megatron `mappings.py` style) + accounting.

Each function is named for where the tensor goes, states its forward/backward pair, and takes an explicit `Comm` (a
process group plus the `CommLog` it records into). Recording here is what lets tests assert the per-layer formulas of
docs/method.md#communication exactly, and what the estimate backend counts under a fake process group. In strict mode
(`CommLog.strict`: verify, the parity tests, test runs of the worker) every collective and ring hop first refuses what
NCCL would refuse or mis-handle (schemes/nccl_rules.py); the few raw torch.distributed calls elsewhere go through
`Comm.check` first.

Volume convention (`recv_numel`, elements received by this rank, bandwidth-optimal algorithms,
docs/method.md#communication):
    all-gather (output n) and reduce-scatter (input n): n·(p−1)/p
    all-reduce (n): 2·n·(p−1)/p
    all-to-all (n, the same on every rank in and out): n·(p−1)/p (each rank keeps its own 1/p)
    broadcast / reduce (n), rooted: n·(p−1)/p on every rank (the p−1 receiving ranks' volume averaged over
        all p, so that D broadcasts of a 1/D weight shard each cost every rank the formula's (D−1)/D·W)
    point-to-point: the received tensor's numel.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tspbench.schemes import nccl_rules


@dataclass
class CommRecord:
    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all | broadcast | reduce | send_recv
    phase: str  # fwd | bwd (anything issued while autograd runs backward, recompute included)
    tag: str  # where: "layer3", "grad_sync", ...
    group_size: int
    numel: int  # elements of the collective's full buffer (see module docstring)
    recv_numel: float  # elements received by this rank
    bytes: int  # numel × element size
    recompute: bool = False  # a forward collective replayed by activation recompute


@dataclass
class CommLog:
    """Per-rank list of every collective issued; `tag` is set by hooks (e.g. one per block)."""

    records: list[CommRecord] = field(default_factory=list)
    tag: str = ""
    enabled: bool = True
    in_backward_fn: bool = False  # inside an autograd Function's backward (not a recompute)
    strict: bool = False
    """Refuse, on every rank at once, any collective NCCL would refuse or mis-handle (schemes/nccl_rules.py): on in
    verify and tests, off in measured runs (its extra all-gather per collective syncs the host)."""
    events: list[tuple[str, str]] = field(default_factory=list)
    """The issue order: ("post" | "wait" | "compute", label) in the order they happened (async collectives are
    posted, later waited; compute marks name the work they overlap with). The overlap tests read this."""

    def event(self, kind: str, label: str) -> None:
        if self.enabled:
            self.events.append((kind, label))

    @contextlib.contextmanager
    def scope(self, tag: str, backward: bool = False):
        """Record under `tag`; `backward=True` from a Function's backward, so its collectives are not
        mistaken for recompute (both run while autograd executes the backward graph)."""
        old = self.tag, self.in_backward_fn
        self.tag, self.in_backward_fn = tag, backward
        try:
            yield
        finally:
            self.tag, self.in_backward_fn = old

    def clear(self) -> None:
        self.records.clear()
        self.events.clear()

    def summary(self, tag: str | None = None) -> dict[str, float]:
        """recv elements per phase (fwd / bwd) for one tag (or all)."""
        out: dict[str, float] = {"fwd": 0.0, "bwd": 0.0}
        for r in self.records:
            if tag is None or r.tag == tag:
                out[r.phase] = out.get(r.phase, 0.0) + r.recv_numel
        return out


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
# torch ≥ 2.12 renames the tensor collectives (the old names warn on every call); older torch (the 2.5–2.11 builds
# of GPU images) only has the old ones. Same signature, same c10d op underneath.
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Pending:
    """An issued (asynchronous) collective. `wait()` blocks until it is done, records the wait in the log's
    issue order, and returns the result (valid only after the wait)."""

    def __init__(self, works, log: CommLog, label: str, result=None, finish=None, keep=None):
        self.works, self.log, self.label, self.result, self.finish = list(works or []), log, label, result, finish
        self.keep = keep  # a send buffer that must outlive the request

    def wait(self):
        while self.works:  # the hops of one batch share its works (Comm.start_shifts): each is waited once
            self.works.pop(0).wait()
        self.keep = None
        self.log.event("wait", self.label)
        return self.finish(self.result) if self.finish is not None else self.result


class Comm:
    """A process group and the log its traffic is recorded in. `rank`/`size` are within the group."""

    def __init__(self, group: dist.ProcessGroup, log: CommLog | None = None, axis: str | None = None):
        self.group, self.axis = group, axis  # axis: the mesh dimension(s) the group spans, e.g. "sp", "dp+sp"
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.log = log if log is not None else CommLog(enabled=False)

    def global_rank(self, group_rank: int) -> int:
        return dist.get_global_rank(self.group, group_rank)

    def check(
        self,
        op: str,
        label: str,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        peer_offset: int | None = None,
        reduce_op: str | None = None,
    ) -> None:
        """Strict mode only (`log.strict`): refuse `op` on every rank of the group if its tensors break NCCL's rules
        (nccl_rules.check; `x` the input or send buffer, `out` the output or receive buffer, `peer_offset` for a ring
        hop). Called by every collective here and before each raw torch.distributed call outside this module."""
        if not self.log.strict:
            return
        where = f"group {self.axis or '?'} (tag {self.log.tag or '-'})"
        names = ("send", "recv") if peer_offset is not None else ("input", "output")
        tensors = {names[0]: x} if out is None else {names[0]: x, names[1]: out}
        nccl_rules.check(op, label, self.group, where, tensors, peer_offset=peer_offset, reduce_op=reduce_op)

    def record(
        self, op: str, t: torch.Tensor, recv_numel: float, phase: str | None = None, tag: str | None = None
    ) -> None:
        if not self.log.enabled:
            return
        in_bwd = torch._C._current_graph_task_id() != -1
        self.log.records.append(
            CommRecord(
                op=op,
                phase=phase or ("bwd" if in_bwd else "fwd"),
                tag=self.log.tag if tag is None else tag,
                group_size=self.size,
                numel=t.numel(),
                recv_numel=recv_numel,
                bytes=t.numel() * t.element_size(),
                recompute=in_bwd and not self.log.in_backward_fn and phase is None,
            )
        )

    # ---- raw collectives (recorded, not differentiable) -------------------------------------------
    def all_reduce(
        self, x: torch.Tensor, tag: str | None = None, phase: str | None = None, op: str = "sum"
    ) -> torch.Tensor:
        """In place: element-wise sum (or max, `op="max"`) over the group."""
        self.check("all_reduce", "all_reduce", x, reduce_op=op)
        self.record("all_reduce", x, 2 * x.numel() * (self.size - 1) / self.size, phase, tag)
        dist.all_reduce(x, op=_REDUCE_OPS[op], group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Concatenate every rank's `x` along `dim`, in group-rank order."""
        xs = x.movedim(dim, 0).contiguous()
        out = xs.new_empty((self.size * xs.shape[0], *xs.shape[1:]))
        self.check("all_gather", "all_gather", xs, out)
        self.record("all_gather", out, out.numel() * (self.size - 1) / self.size)
        _all_gather_tensor(out, xs, group=self.group)
        return out.movedim(0, dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Sum over ranks, then keep this rank's 1/p slice of `dim` (the dual of all_gather)."""
        xs = x.movedim(dim, 0).contiguous()
        out = xs.new_empty((xs.shape[0] // self.size, *xs.shape[1:]))
        self.check("reduce_scatter", "reduce_scatter", xs, out)
        self.record("reduce_scatter", xs, xs.numel() * (self.size - 1) / self.size)
        _reduce_scatter_tensor(out, xs, group=self.group)
        return out.movedim(0, dim)

    def all_to_all(self, x: torch.Tensor, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        """Split `x` into p chunks along `scatter_dim`, send chunk j to rank j, and concatenate the chunks received
        along `gather_dim` in group-rank order (DeepSpeed-Ulysses' sequence ↔ head exchange). The output has the
        input's numel; all_to_all(·, gather_dim, scatter_dim) is its inverse."""
        p = self.size
        chunks = x.unflatten(scatter_dim, (p, -1)).movedim(scatter_dim, 0).contiguous()  # [p, *chunk]
        out = torch.empty_like(chunks)  # out[r]: the chunk rank r sent to this rank
        self.check("all_to_all", "all_to_all", chunks, out)
        self.record("all_to_all", chunks, chunks.numel() * (p - 1) / p)
        dist.all_to_all_single(out, chunks, group=self.group)
        return out.movedim(0, gather_dim).flatten(gather_dim, gather_dim + 1)

    def broadcast(self, x: torch.Tensor, src: int) -> torch.Tensor:
        """`x` from group rank `src` to every rank (in place on non-owners' buffer)."""
        self.check("broadcast", "broadcast", x)
        self.record("broadcast", x, x.numel() * (self.size - 1) / self.size)
        dist.broadcast(x, src=self.global_rank(src), group=self.group)
        return x

    def reduce(self, x: torch.Tensor, dst: int) -> torch.Tensor:
        """Sum of `x` over ranks, valid on group rank `dst` (the dual of broadcast)."""
        self.check("reduce", "reduce", x, reduce_op="sum")
        self.record("reduce", x, x.numel() * (self.size - 1) / self.size)
        dist.reduce(x, dst=self.global_rank(dst), group=self.group)
        return x

    def start_shift(
        self, send: torch.Tensor, recv: torch.Tensor, offset: int = 1, tag: int = 0, label: str = "send_recv"
    ) -> Pending:
        """Async ring hop: send `send` to rank+offset, receive `recv` from rank−offset. `wait()` before
        reading `recv` (or writing `send`). Concurrent hops between the same peers need distinct `tag`s (gloo
        matches by tag; NCCL matches in issue order, which is the same)."""
        return self.start_shifts([(send, recv, offset, tag, label)])[0]

    def start_shifts(self, hops: list[tuple[torch.Tensor, torch.Tensor, int, int, str]]) -> list[Pending]:
        """Several ring hops (send, recv, offset, tag, label) posted as ONE `batch_isend_irecv`: NCCL runs each
        batch as one group on the communicator's single stream, so hops posted in separate batches run one after
        the other (docs/method.md#gpu-review, finding 4) and hops of one batch run together. One Pending per hop."""
        ops, pend = [], []
        for send, recv, offset, tag, label in hops:
            send = send.contiguous()
            self.check("send_recv", label, send, recv, peer_offset=offset)
            self.record("send_recv", recv, recv.numel())
            peer_to = self.global_rank((self.rank + offset) % self.size)
            peer_from = self.global_rank((self.rank - offset) % self.size)
            ops += [
                dist.P2POp(dist.isend, send, peer_to, self.group, tag),
                dist.P2POp(dist.irecv, recv, peer_from, self.group, tag),
            ]
            self.log.event("post", label)
            pend.append((label, recv, send))
        shared = list(dist.batch_isend_irecv(ops))  # one list: gloo's send work blocks again if waited twice
        out = [Pending(None, self.log, label, recv, keep=sent) for label, recv, sent in pend]
        for p in out:
            p.works = shared
        return out

    # ---- asynchronous collectives: post now, wait where the result is used --------------------------------
    def start_broadcast(self, buf: torch.Tensor, src: int, label: str = "broadcast") -> Pending:
        """`buf` of group rank `src` into every rank's `buf`."""
        self.check("broadcast", label, buf)
        self.record("broadcast", buf, buf.numel() * (self.size - 1) / self.size)
        self.log.event("post", label)
        work = dist.broadcast(buf, src=self.global_rank(src), group=self.group, async_op=True)
        return Pending([work], self.log, label, buf)

    def start_reduce(self, buf: torch.Tensor, dst: int, label: str = "reduce") -> Pending:
        """Sum of `buf` over ranks into group rank `dst`'s `buf` (the dual of broadcast)."""
        self.check("reduce", label, buf, reduce_op="sum")
        self.record("reduce", buf, buf.numel() * (self.size - 1) / self.size)
        self.log.event("post", label)
        work = dist.reduce(buf, dst=self.global_rank(dst), group=self.group, async_op=True)
        return Pending([work], self.log, label, buf)

    def start_all_gather(self, x: torch.Tensor, out: torch.Tensor | None = None, label: str = "all_gather") -> Pending:
        """Every rank's `x` concatenated along dim 0, in group-rank order, into `out` (allocated if None)."""
        x = x.contiguous()
        if out is None:
            out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
        self.check("all_gather", label, x, out)
        self.record("all_gather", out, out.numel() * (self.size - 1) / self.size)
        self.log.event("post", label)
        work = _all_gather_tensor(out, x, group=self.group, async_op=True)
        return Pending([work], self.log, label, out)

    def start_reduce_scatter(self, x: torch.Tensor, label: str = "reduce_scatter") -> Pending:
        """Sum over ranks of `x`, this rank's 1/p slice of dim 0 (the dual of start_all_gather)."""
        x = x.contiguous()
        out = x.new_empty((x.shape[0] // self.size, *x.shape[1:]))
        self.check("reduce_scatter", label, x, out)
        self.record("reduce_scatter", x, x.numel() * (self.size - 1) / self.size)
        self.log.event("post", label)
        work = _reduce_scatter_tensor(out, x, group=self.group, async_op=True)
        return Pending([work], self.log, label, out)

    def start_all_reduce(
        self, x: torch.Tensor, label: str = "all_reduce", *, tag: str | None = None, phase: str | None = None
    ) -> Pending:
        """In place: the sum of contiguous `x` over the group (Megatron's dgrad all-reduce behind the wgrad GEMM; a
        gradient-sync bucket, ParallelModel.finish_grad_sync, with tag and phase "grad_sync")."""
        self.check("all_reduce", label, x, reduce_op="sum")
        self.record("all_reduce", x, 2 * x.numel() * (self.size - 1) / self.size, phase, tag)
        self.log.event("post", label)
        work = dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return Pending([work], self.log, label, x)

    def start_all_to_all(self, chunks: torch.Tensor, label: str = "all_to_all") -> Pending:
        """`chunks` [p, …] contiguous: chunk j to rank j; the result's chunk r is the one rank r sent here (the
        exchange of `all_to_all`, posted now; DeepSpeed-Ulysses' overlapped all-to-alls)."""
        p = self.size
        out = torch.empty_like(chunks)
        self.check("all_to_all", label, chunks, out)
        self.record("all_to_all", chunks, chunks.numel() * (p - 1) / p)
        self.log.event("post", label)
        work = dist.all_to_all_single(out, chunks, group=self.group, async_op=True)
        return Pending([work], self.log, label, out, keep=chunks)


# ---- differentiable region mappings ---------------------------------------------------------------
class _CopyToRegion(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward (in place, as Megatron's
    `_reduce`: the incoming gradient is this Function's own buffer)."""

    @staticmethod
    def forward(ctx, x, comm: Comm):
        ctx.comm, ctx.tag = comm, comm.log.tag
        return x

    @staticmethod
    def backward(ctx, g):
        with ctx.comm.log.scope(ctx.tag, backward=True):
            return ctx.comm.all_reduce(g.contiguous()), None


class _ReduceFromRegion(torch.autograd.Function):
    """Megatron's g: all-reduce forward (in place: the input is the row-parallel GEMM's fresh partial sum,
    used by nothing else), identity backward."""

    @staticmethod
    def forward(ctx, x, comm: Comm):
        return comm.all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromSequence(torch.autograd.Function):
    """All-gather along `dim` forward; reduce-scatter of the gradient backward (each rank's tokens
    were used by every rank, so their gradient is the sum over ranks)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, dim: int):
        ctx.comm, ctx.dim, ctx.tag = comm, dim, comm.log.tag
        return comm.all_gather(x, dim)

    @staticmethod
    def backward(ctx, g):
        with ctx.comm.log.scope(ctx.tag, backward=True):
            return ctx.comm.reduce_scatter(g, ctx.dim), None, None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Reduce-scatter along `dim` forward; all-gather of the gradient backward (Megatron-SP's exit)."""

    @staticmethod
    def forward(ctx, x, comm: Comm, dim: int):
        ctx.comm, ctx.dim, ctx.tag = comm, dim, comm.log.tag
        return comm.reduce_scatter(x, dim)

    @staticmethod
    def backward(ctx, g):
        with ctx.comm.log.scope(ctx.tag, backward=True):
            return ctx.comm.all_gather(g, ctx.dim), None, None


class _AllToAll(torch.autograd.Function):
    """All-to-all forward (scatter `scatter_dim`, gather `gather_dim`); the inverse all-to-all of the gradient
    backward (scatter `gather_dim`, gather `scatter_dim`): the exchange is a permutation of elements across ranks,
    so its adjoint is the inverse permutation."""

    @staticmethod
    def forward(ctx, x, comm: Comm, scatter_dim: int, gather_dim: int):
        ctx.comm, ctx.dims, ctx.tag = comm, (scatter_dim, gather_dim), comm.log.tag
        return comm.all_to_all(x, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, g):
        scatter_dim, gather_dim = ctx.dims
        with ctx.comm.log.scope(ctx.tag, backward=True):
            return ctx.comm.all_to_all(g, gather_dim, scatter_dim), None, None, None


def copy_to_region(x: torch.Tensor, comm: Comm | None) -> torch.Tensor:
    """f. `comm` None (a one-rank group, e.g. tp_sp with T = 1): the identity, as Megatron's mappings."""
    return x if comm is None else _CopyToRegion.apply(x, comm)


def reduce_from_region(x: torch.Tensor, comm: Comm | None) -> torch.Tensor:
    """g. `comm` None (a one-rank group): the identity."""
    return x if comm is None else _ReduceFromRegion.apply(x, comm)


def gather_from_sequence(x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
    return _GatherFromSequence.apply(x, comm, dim)


def reduce_scatter_to_sequence(x: torch.Tensor, comm: Comm, dim: int) -> torch.Tensor:
    return _ReduceScatterToSequence.apply(x, comm, dim)


def all_to_all(x: torch.Tensor, comm: Comm, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Differentiable all-to-all (Comm.all_to_all); backward is the inverse all-to-all."""
    return _AllToAll.apply(x, comm, scatter_dim, gather_dim)

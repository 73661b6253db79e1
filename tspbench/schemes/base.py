"""The sharded model as one rank sees it (`ParallelModel`): its token layout, which gradients need summing
over which group (bucketed all-reduces posted during backward, docs/method.md#choice-overlap), serving (KV
cache, decode), and how every local tensor goes back to full shape for verification. How the rank's weights are
built is schemes/ops/sharding.py.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tspbench.config import GRAD_BUCKET_ELEMS
from tspbench.model import CoreAttention, Transformer, token_loss_sum
from tspbench.parallel import ParallelConfig
from tspbench.schemes.comm import Comm, CommLog, Pending
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import ApplyArgs, Shard

T = TypeVar("T")


class VocabHead(Protocol):
    """A split embedding / LM head (schemes/ops/vocab.py VocabShard, schemes/ops/vocab_ring.py VocabRing)."""

    def loss_sum(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor: ...

    def full(self, logits: torch.Tensor) -> torch.Tensor: ...

    def full_decode(self, logits: torch.Tensor) -> torch.Tensor: ...


class ParallelModel(nn.Module):
    """The sharded model as one rank sees it.

    module:  the Transformer with scheme modules inside (forward on local tokens + global positions)
    layout:  this rank's tokens within a replica's sequence (None: the full sequence)
    shards:  local parameter name → Shard
    seq:     the group whose ranks hold different tokens of one replica (None if tokens are replicated)
    dp:      the data-parallel group (None if dp = 1)
    vocab:   the split embedding / LM head when there is one: a VocabShard (schemes/ops/vocab.py: logits
             [B, S_loc, V/T], vocabulary-parallel cross-entropy) or a VocabRing (schemes/ops/vocab_ring.py: the
             head passes hidden states, the cross-entropy runs on the ring); `loss_sum` and `full` either way
    """

    def __init__(
        self,
        module: Transformer,
        par: ParallelConfig,
        shards: dict[str, Shard],
        args: ApplyArgs,
        *,
        layout: SeqLayout | None = None,
        seq: Comm | None = None,
        vocab: VocabHead | None = None,
    ):
        super().__init__()
        self.module, self.par, self.shards = module, par, shards
        self.layout, self.seq, self.vocab = layout, seq, vocab
        self.dp, self.log = args.comm("dp"), args.log
        self.grad_bucket_elems = GRAD_BUCKET_ELEMS
        module.set_recompute(par.recompute)  # the scheme's attention modules included (selective)
        # The gradient sync's groups: a weight shared by ranks that saw different tokens (Shard.grad_sum) is
        # summed over that group and averaged over data-parallel replicas in ONE all-reduce over both axes;
        # every other gradient is averaged over dp alone. A KV head replicated over a run of tensor ranks has a
        # grad_sum that is no mesh axis (ApplyArgs.block_group): its dp × group is built here, in shard order
        # (the same on every rank, as dist.new_group needs).
        self.sync_groups: dict[str | None, tuple[Comm, int]] = {}
        dp_size = self.dp.size if self.dp is not None else 1
        for shard in shards.values():
            if shard.fsdp:  # FSDP reduce-scatters these itself (schemes/fsdp_sp.py)
                continue
            c = shard.grad_sum
            key = c.axis if c is not None else None
            if key not in self.sync_groups:
                group = args.sync_group(c)  # a communicator of its own (ApplyArgs.sync_group)
                if group is not None:
                    self.sync_groups[key] = (group, dp_size)
        # The sync overlaps backward: a hook on each synced parameter marks its gradient complete, and a bucket is
        # posted as soon as all of its gradients are (finish_grad_sync waits). Weak: the hooks keep no model alive.
        self._plan: list[_Bucket] | None = None
        self._plan_cap = 0
        self._bucket_of: dict[int, _Bucket] = {}
        self._next = 0  # the next bucket of the plan to post
        me = weakref.ref(self)
        for name, p in module.named_parameters():
            if self._syncs(name):
                p.register_post_accumulate_grad_hook(lambda p, me=me: _call(me, p))
        for i, block in enumerate(module.blocks):  # tag every collective with its layer
            block.register_forward_pre_hook(lambda m, a, i=i: setattr(self.log, "tag", f"layer{i}"))
            for m in block.modules():  # ... also when only the attention kernel is recomputed in backward
                if isinstance(m, CoreAttention):
                    m.rerun_context = functools.partial(self.log.scope, f"layer{i}")
        module.norm.register_forward_pre_hook(lambda m, a: setattr(self.log, "tag", "head"))
        module.embed.register_forward_pre_hook(lambda m, a: setattr(self.log, "tag", "embed"))
        # backward's progress in the issue order (CommLog.events, what the gradient-sync overlap test reads): block i's
        # backward starts when its output's gradient arrives; the embedding's output gradient ends layer 0's
        for i, block in enumerate(module.blocks):
            block.register_forward_hook(lambda m, a, out, i=i: self._mark_backward(out, f"backward:layer{i}"))
        module.embed.register_forward_hook(lambda m, a, out: self._mark_backward(out, "backward:embed"))

    def _mark_backward(self, out, label: str) -> None:
        """A compute event in the CommLog when the gradient of `out` (a forward output) arrives in backward."""
        in_backward = torch._C._current_graph_task_id() != -1  # a recompute's forward: not the step's
        if self.log.enabled and isinstance(out, torch.Tensor) and out.requires_grad and not in_backward:
            log = self.log
            out.register_hook(lambda g: log.event("compute", label))

    # ---- inputs ------------------------------------------------------------------------------------
    def local_batch(self, tokens: torch.Tensor, targets: torch.Tensor):
        """From the global batch [dp·B, S]: this replica's rows, then this rank's tokens.
        Returns (tokens, targets, positions) with positions the global token positions."""
        if self.dp is not None:
            tokens = tokens.chunk(self.dp.size, 0)[self.dp.rank]
            targets = targets.chunk(self.dp.size, 0)[self.dp.rank]
        self.module.check_window((self.layout.seq_len if self.layout else tokens.shape[1]) - 1)  # host ints
        if self.layout is None:
            return tokens, targets, torch.arange(tokens.shape[1], device=tokens.device)
        pos = self.layout.positions
        return tokens.index_select(1, pos), targets.index_select(1, pos), pos

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.module(tokens, positions)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor):
        """This rank's share of the replica's mean token loss (the shares sum to the mean over `seq`).
        Returns (loss to backward, logits)."""
        logits = self(tokens, positions)
        n_tokens = targets.shape[0] * (self.layout.seq_len if self.layout else targets.shape[1])
        if self.vocab is not None:  # vocabulary-parallel (schemes/ops/vocab.py) or the TSP ring (vocab_ring.py)
            return self.vocab.loss_sum(logits, targets) / n_tokens, logits
        return token_loss_sum(logits, targets) / n_tokens, logits

    def replica_loss(self, local_loss: torch.Tensor) -> torch.Tensor:
        """The replica's loss value (for reporting), summed over the sequence group."""
        loss = local_loss.detach().clone()
        if self.seq is not None:
            self.seq.check("all_reduce", "replica_loss", loss, reduce_op="sum")
            dist.all_reduce(loss, group=self.seq.group)
        return loss

    # ---- serving (schemes/ops/decode.py) ---------------------------------------------------------------
    kv_seq: Comm | None = None
    """The group the KV cache's tokens are sharded over, where it is not `seq` (tp_sp with Megatron-SP and a
    replicated vocabulary: `seq` is sp × tp, the cache is sharded over sp)."""

    def start_kv_cache(self, new_tokens: int = 0) -> None:
        """Empty KV caches: the next forward (this scheme's token layout, no grad) is the prefill. Room for
        `new_tokens` decoded tokens is reserved with it (a rank of a token-sharded cache gets a 1/group share,
        rounded up)."""
        group = self.kv_seq if self.kv_seq is not None else self.seq
        seq = group.size if group is not None else 1
        self.kv_caches = self.module.start_kv_cache(-(-new_tokens // seq))
        self._set_decoding(False)

    def _set_decoding(self, on: bool) -> None:
        """Switch every module with a decode path (f/g on one replicated token; schemes/ops/decode.py) and hand
        them the shared DecodeState."""
        from tspbench.schemes.ops.decode import Decodable, DecodeState

        self.decode_state = getattr(self, "decode_state", None) or DecodeState()
        for m in self.module.modules():
            if isinstance(m, Decodable):
                m.decoding, m.decode_state = on, self.decode_state
        self.decoding = on

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """One decode step after `start_kv_cache` and a prefill. tokens: [dp·B, 1], the new token of every
        replica at global `position` (the same on every rank of a group). Returns this rank's logits
        [B, 1, V] ([B, 1, V/T] where the vocabulary is split)."""
        self.module.check_window(position)  # a host int: no read of the device's positions
        if not getattr(self, "decoding", False):  # once, not on every token
            self._set_decoding(True)
        self.decode_state.position = position
        if self.dp is not None:
            tokens = tokens.chunk(self.dp.size, 0)[self.dp.rank]
        # torch.full launches a fill kernel; torch.tensor([...]) would copy from host memory every step
        return self.module(tokens, torch.full((1,), position, dtype=torch.long, device=tokens.device))

    def kv_cache_bytes(self, allocated: bool = False) -> int:
        """This rank's cached K/V bytes (or, `allocated`, the bytes reserved for them)."""
        caches = getattr(self, "kv_caches", [])
        return sum(kv.capacity_bytes() if allocated else kv.nbytes() for kv in caches)

    def full_decode_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """A decode step's local logits → [B, 1, V] (they are replicated over the sequence group)."""
        with _no_log(self.log):
            return logits if self.vocab is None else self.vocab.full_decode(logits)

    # ---- gradients ---------------------------------------------------------------------------------
    def _bucket_plan(self) -> list[_Bucket]:
        """The gradient-sync buckets of this model (built at the first gradient of a step, for the current
        `grad_bucket_elems`): the parameters that need a sync, in REVERSE parameter order (the order backward
        produces their gradients, as DDP and Megatron's distributed optimizer assume), cut per sync group into
        consecutive runs of at most `grad_bucket_elems` elements (a larger gradient is a bucket alone), and posted in
        the order their last gradient is expected, the same on every rank."""
        cap = self.grad_bucket_elems
        if self._plan is not None and self._plan_cap == cap:
            return self._plan
        runs: dict[str | None, list[tuple[int, nn.Parameter]]] = {}
        order = [(name, p) for name, p in self.named_local_params() if self._syncs(name)]
        for pos, (name, p) in enumerate(reversed(order)):
            runs.setdefault(self._sync_key(self.shards[name]), []).append((pos, p))
        plan: list[tuple[int, _Bucket]] = []
        for key, members in runs.items():
            for chunk in _buckets(members, cap, lambda m: m[1].numel()):
                plan.append((chunk[-1][0], _Bucket(key, [p for _, p in chunk])))  # posted at its last gradient
        self._plan = [b for _, b in sorted(plan, key=lambda t: t[0])]
        self._plan_cap = cap
        self._bucket_of = {id(p): b for b in self._plan for p in b.params}
        return self._plan

    def _syncs(self, name: str) -> bool:
        """The parameter's gradient is all-reduced by the gradient sync (FSDP2's reduce-scatters its own)."""
        shard = self.shards[name]
        return not shard.fsdp and self._sync_key(shard) in self.sync_groups

    @staticmethod
    def _sync_key(shard: Shard) -> str | None:
        return shard.grad_sum.axis if shard.grad_sum is not None else None

    def _grad_ready(self, p: nn.Parameter) -> None:
        """Post-accumulate-grad hook: `p`'s gradient of this step is complete. When it completes its bucket, the
        bucket is packed (`_pack`), and every packed bucket whose turn has come is posted (`_post_ready`)."""
        self._bucket_plan()
        b = self._bucket_of[id(p)]
        if b.flat is not None or id(p) in b.arrived:
            self._late_grad(p)
            return
        b.arrived.add(id(p))
        if self._bucket_ready(b):
            self._pack(b)
        self._post_ready()

    @staticmethod
    def _bucket_ready(b: _Bucket) -> bool:
        """Every gradient of the bucket has arrived (DDP's rule: a bucket is reduced only once it is complete)."""
        return len(b.arrived) == len(b.params)

    def _late_grad(self, p: nn.Parameter) -> None:
        """A second gradient for a parameter whose bucket has already been packed this step: it would be lost."""
        raise RuntimeError(
            f"a gradient of {self._param_name(p)} arrived after its gradient-sync bucket was packed: a parameter "
            "used twice in one step, or a backward without finish_grad_sync after the previous one"
        )

    def _param_name(self, p: nn.Parameter) -> str:
        return next((n for n, q in self.named_local_params() if q is p), "a parameter")

    @torch.no_grad()
    def _pack(self, b: _Bucket) -> None:
        """The bucket's gradients as one flat buffer: a lone gradient is its own buffer (reduced in place);
        several are concatenated once and each parameter's .grad becomes a view of the buffer (Megatron's grad
        buffer, DDP's gradient_as_bucket_view), so the reduced sums need no copy back and the separate gradients
        are freed: the buffer is the gradients' memory, plus the one-bucket transient of the concatenation.
        Parameters without a gradient this step (unused) are left out."""
        params = [p for p in b.params if p.grad is not None]
        if not params:
            b.flat = torch.empty(0)
            return
        if len(params) == 1:
            b.flat = params[0].grad
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        off = 0
        for p in params:
            p.grad = flat[off : off + p.numel()].view_as(p)
            off += p.numel()
        b.flat = flat

    def _post_ready(self) -> None:
        """Post, in plan order, every bucket packed so far whose predecessors are posted: the same issue order on
        every rank of every group, whatever order backward finished the buckets in."""
        plan = self._plan or []
        while self._next < len(plan) and plan[self._next].flat is not None:
            b = plan[self._next]
            flat = b.flat
            if flat is not None and flat.numel() > 0:
                comm, _ = self.sync_groups[b.key]
                label = f"grad_sync:bucket{self._next}"
                b.pending = comm.start_all_reduce(flat, label, tag="grad_sync", phase="grad_sync")
            self._next += 1

    def finish_grad_sync(self) -> None:
        """Sum partial gradients of weights shared by ranks that saw different tokens, and average over DP
        replicas: one all-reduce per bucket over its group (`sync_groups`: the in-group sum and the data-parallel
        average together), buckets of at most `grad_bucket_elems` elements (few, large collectives; Megatron's DDP
        buckets are 40M). Backward has already posted every bucket whose gradients all arrived (`_grad_ready`, a
        post-accumulate-grad hook on each synced parameter: the all-reduces run behind the rest of the backward,
        as DDP's and Megatron's --overlap-grad-reduce); this packs and posts what hooks could not (a bucket with a
        parameter that got no gradient this step), then waits for every bucket in order and divides by dp."""
        plan = self._bucket_plan()
        for b in plan:
            if b.flat is None:
                self._pack(b)
        self._post_ready()
        for b in plan:
            if b.pending is not None:
                b.pending.wait()
                _, divide = self.sync_groups[b.key]
                if divide > 1 and b.flat is not None:
                    b.flat.div_(divide)
            b.reset()
        self._next = 0

    def named_local_params(self):
        return self.module.named_parameters()

    # ---- back to full shape (verification) --------------------------------------------------------
    def unshard(self, name: str, t: torch.Tensor) -> torch.Tensor:
        s = self.shards[name]
        if isinstance(t, DTensor):  # FSDP2's sharded parameter (or gradient): DTensor knows its layout
            return t.full_tensor()
        if s.comm is None or s.dim is None:
            return t
        full = s.comm.all_gather(t, s.dim)
        if s.replicas == 1:
            return full
        # A replicated KV head: one copy of each, those of the ranks ≡ this rank (mod replicas), so that across
        # the group every rank's copy is part of some rank's full tensor (and verify compares them all).
        parts = full.chunk(s.comm.size, s.dim)
        return torch.cat(parts[s.comm.rank % s.replicas :: s.replicas], s.dim)

    def full_state(self, grads: bool) -> dict[str, torch.Tensor]:
        """Every parameter (or its gradient) at full shape, keyed by the reference name."""
        local = {name: p.grad if grads else p.data for name, p in self.named_local_params()}
        return self.full_state_of({k: v for k, v in local.items() if v is not None})

    def full_state_of(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Local tensors shaped like this rank's parameters (e.g. gradients saved earlier) at full shape,
        keyed by the reference name (collective over each shard's group)."""
        with self.log.scope("verify"), _no_log(self.log):
            return {self.shards[n].name: self.unshard(n, t.contiguous()) for n, t in local.items()}

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Local logits [B, S_loc, V] (or [B, S_loc, V/T]) → this replica's logits [B, S, V] in logical order."""
        with _no_log(self.log):
            if self.vocab is not None:
                logits = self.vocab.full(logits)
            if self.seq is None or self.layout is None:
                return logits
            return self.layout.unshard(self.seq.all_gather(logits.contiguous(), 1), 1)

    # ---- sharding audit -----------------------------------------------------------------------------
    def param_bytes(self) -> int:
        return sum(local_tensor(p).numel() * p.element_size() for _, p in self.named_local_params())


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: the local shard of an FSDP2 DTensor, `t` itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def _call(me: weakref.ref[ParallelModel], p: nn.Parameter) -> None:
    """The gradient hook's body: the model through its weak reference (gone: nothing to sync)."""
    model = me()
    if model is not None:
        model._grad_ready(p)


@dataclass(eq=False)
class _Bucket:
    """One gradient-sync bucket: parameters of one sync group, and this step's state."""

    key: str | None
    """Its sync group (ParallelModel.sync_groups)."""
    params: list[nn.Parameter]
    """In reverse parameter order."""
    arrived: set[int] = field(default_factory=set)
    """ids of the parameters whose gradient has been accumulated this step."""
    flat: torch.Tensor | None = None
    """The packed gradients (ParallelModel._pack), None until the bucket is complete."""
    pending: Pending | None = None
    """Its posted all-reduce."""

    def reset(self) -> None:
        self.arrived, self.flat, self.pending = set(), None, None


def _buckets(items: list[T], cap: int, numel: Callable[[T], int]) -> list[list[T]]:
    """Consecutive groups of items of at most `cap` elements in all (a larger item is a group alone)."""
    out: list[list[T]] = []
    cur: list[T] = []
    n = 0
    for g in items:
        if cur and n + numel(g) > cap:
            out.append(cur)
            cur, n = [], 0
        cur.append(g)
        n += numel(g)
    if cur:
        out.append(cur)
    return out


class _no_log:
    def __init__(self, log: CommLog):
        self.log = log

    def __enter__(self):
        self.old, self.log.enabled = self.log.enabled, False

    def __exit__(self, *a):
        self.log.enabled = self.old

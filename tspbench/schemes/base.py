"""The sharded model as one rank sees it (`ParallelModel`): its token layout, which gradients need summing
over which group (bucketed all-reduce after backward), serving (KV cache, decode), and how every local tensor
goes back to full shape for verification. How the rank's weights are built is schemes/ops/sharding.py.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from tspbench.config import GRAD_BUCKET_ELEMS
from tspbench.model import CoreAttention, Transformer, token_loss_sum
from tspbench.parallel import ParallelConfig
from tspbench.schemes.comm import Comm, CommLog
from tspbench.schemes.ops.layout import SeqLayout
from tspbench.schemes.ops.sharding import ApplyArgs, Shard


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
                group = args.sync_group(c) if c is not None else self.dp
                if group is not None:
                    self.sync_groups[key] = (group, dp_size)
        for i, block in enumerate(module.blocks):  # tag every collective with its layer
            block.register_forward_pre_hook(lambda m, a, i=i: setattr(self.log, "tag", f"layer{i}"))
            for m in block.modules():  # ... also when only the attention kernel is recomputed in backward
                if isinstance(m, CoreAttention):
                    m.rerun_context = functools.partial(self.log.scope, f"layer{i}")
        module.norm.register_forward_pre_hook(lambda m, a: setattr(self.log, "tag", "head"))
        module.embed.register_forward_pre_hook(lambda m, a: setattr(self.log, "tag", "embed"))

    # ---- inputs ------------------------------------------------------------------------------------
    def local_batch(self, tokens: torch.Tensor, targets: torch.Tensor):
        """From the global batch [dp·B, S]: this replica's rows, then this rank's tokens.
        Returns (tokens, targets, positions) with positions the global token positions."""
        if self.dp is not None:
            tokens = tokens.chunk(self.dp.size, 0)[self.dp.rank]
            targets = targets.chunk(self.dp.size, 0)[self.dp.rank]
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
    def finish_grad_sync(self) -> None:
        """Sum partial gradients of weights shared by ranks that saw different tokens, and average over DP
        replicas: one all-reduce per group (`sync_groups`), in flattened buckets of at most `grad_bucket_elems`
        elements (few, large collectives; Megatron's DDP buckets are 40M)."""
        buckets: dict[str | None, list[torch.Tensor]] = {}
        for name, p in self.named_local_params():
            shard = self.shards[name]
            c = shard.grad_sum
            key = c.axis if c is not None else None
            if p.grad is not None and not shard.fsdp and key in self.sync_groups:
                buckets.setdefault(key, []).append(p.grad)
        for key, grads in buckets.items():
            comm, divide = self.sync_groups[key]
            for chunk in _buckets(grads, self.grad_bucket_elems):
                # One flat buffer per bucket (fewer, larger messages); a lone gradient is reduced in place.
                flat = chunk[0] if len(chunk) == 1 else torch.cat([g.reshape(-1) for g in chunk])
                comm.all_reduce(flat, tag="grad_sync", phase="grad_sync")
                if divide > 1:
                    flat /= divide
                if len(chunk) > 1:
                    off = 0
                    for g in chunk:
                        g.copy_(flat[off : off + g.numel()].view_as(g))
                        off += g.numel()
                del flat

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


def _buckets(grads: list[torch.Tensor], cap: int) -> list[list[torch.Tensor]]:
    """Consecutive groups of gradients of at most `cap` elements (a larger gradient is a group alone)."""
    out: list[list[torch.Tensor]] = []
    cur: list[torch.Tensor] = []
    n = 0
    for g in grads:
        if cur and n + g.numel() > cap:
            out.append(cur)
            cur, n = [], 0
        cur.append(g)
        n += g.numel()
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

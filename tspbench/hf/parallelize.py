"""`tspbench.parallelize`: a Hugging Face Llama-family model (LlamaForCausalLM, MistralForCausalLM) sharded by a
scheme of the registry (TSP by default), as torchtitan's parallelize_llama shards its own Llama.

How. The model's config becomes a ModelConfig and its weights our Transformer's (tspbench/hf/convert.py: renamed,
q/k rows permuted to interleaved RoPE pairs). The scheme builds its ParallelModel exactly as `tspbench.verify`
proves it (schemes/*.py apply: build full, then shard), and every local parameter is then overwritten with its
slice of the Hugging Face weight, cut as its Shard spec says (the inverse of ParallelModel.unshard). The forward is
our model's, not transformers' code: it equals the Hugging Face model (tests/hf) but uses none of its kernels.

Tokens. Every rank passes the SAME global batch `input_ids` [dp·B, S] (and `labels`, Hugging Face's convention:
aligned with the inputs, shifted inside, -100 ignored), on the host or the device (the forward moves them to the
model's), as torchtitan's context-parallel users hand every rank of a CP group the full sequence: the module takes
this rank's replica rows and its tokens (zigzag for sp, tsp, fsdp_sp), so `out.logits` are this rank's tokens only
([B, S_loc, V] at global positions `module.local_positions`; `module.full_logits(out.logits)` gathers them). S must
be the `seq_len` given here (the token layout is fixed).

Loss and gradients. `out.loss` has the value of Hugging Face's loss over the whole global batch (mean over the
non-ignored labels) on every rank, and its gradient is this rank's share of it; the gradient sync (partial
gradients of replicated weights summed over the token group, averaged over data-parallel replicas) is posted in
buckets during backward and completed by a callback when backward ends (as DDP does), so after `loss.backward()`
every parameter's .grad is its final gradient: any elementwise optimizer (torch.optim.AdamW) on
`module.parameters()` (this rank's shards) then updates exactly what it would on the full model. One backward per
optimizer step (no gradient accumulation: a second backward would sum synced gradients again), and clip by the
global norm only after gathering it (a local clip_grad_norm_ sees 1/D of the weights).

Back to full shape (collective): `module.hf_state_dict()` and `module.hf_grads()` in Hugging Face names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from tspbench.config import ConfigError, ModelConfig
from tspbench.hf.convert import model_config_from_hf, state_dict_from_hf, state_dict_to_hf
from tspbench.model import token_loss_sum
from tspbench.parallel import ParallelConfig, validate_parallel
from tspbench.parallel import scheme as scheme_of
from tspbench.schemes import ApplyArgs, ParallelModel, apply_scheme, build_mesh
from tspbench.schemes.comm import CommLog

IGNORE = -100
"""Hugging Face's ignore_index for labels (padding, the last position after the shift)."""


@dataclass
class ParallelOutput:
    """What the forward returns: Hugging Face's CausalLMOutput fields that apply (attribute access)."""

    loss: torch.Tensor | None
    """The global batch's mean token loss (value replicated; gradient this rank's share), None without labels."""
    logits: torch.Tensor
    """This rank's logits [B, S_loc, V] (tokens at `local_positions`; V/T where the vocabulary is split)."""


class HFParallel(nn.Module):
    """The sharded model one rank trains (see the module docstring). `pm`: the scheme's ParallelModel; `device`: its
    parameters' device, where each forward moves its inputs."""

    def __init__(
        self, pm: ParallelModel, cfg: ModelConfig, seq_len: int, config: Any = None, device: torch.device | None = None
    ):
        super().__init__()
        self.pm, self.cfg, self.seq_len, self.config = pm, cfg, seq_len, config
        self.device = device if device is not None else next(pm.parameters()).device
        self.local_positions: torch.Tensor | None = None
        """Global positions of this rank's tokens (set by each forward)."""

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> ParallelOutput:
        """input_ids, labels: the global batch [dp·B, S], the same on every rank, on any device (moved to the
        model's). attention_mask: None or all ones (padding masks are not implemented: mark padded labels -100
        instead). No host synchronisation: the mask's check (`refuse`) reads a host tensor on the host and asserts on
        the device otherwise, and the label count stays a device tensor."""
        if input_ids.dim() != 2 or input_ids.shape[1] != self.seq_len:
            raise ValueError(f"input_ids must be [batch, {self.seq_len}] (the seq_len given to parallelize)")
        if attention_mask is not None:
            refuse(
                attention_mask.bool().all(),
                "attention_mask with padding is not supported: pass None and set padded labels to -100",
            )
        if labels is not None and self.pm.vocab is not None:  # the last position's target is always ignored
            raise ValueError("labels need vocab=replicated (the vocabulary-parallel loss has no ignore_index)")
        input_ids = input_ids.to(self.device)
        targets = torch.full_like(input_ids, IGNORE)
        if labels is not None:
            targets[:, :-1] = labels[:, 1:].to(self.device)  # next-token targets, as Hugging Face shifts its labels
        tok, tgt, pos = self.pm.local_batch(input_ids, targets)
        self.local_positions = pos
        logits = self.pm(tok, pos)
        if torch.is_grad_enabled() and logits.requires_grad:
            logits.register_hook(self._queue_grad_sync)
        loss = None if labels is None else self._loss(logits, tgt, (targets != IGNORE).sum())
        return ParallelOutput(loss, logits)

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, n_valid: torch.Tensor) -> torch.Tensor:
        """Σ local token losses / n_valid (all replicas' labels, a device tensor), × dp since the gradient sync
        averages over dp: the sync then yields the gradient of the global mean. Returned with the global mean's
        value."""
        pm = self.pm
        dp = pm.dp.size if pm.dp is not None else 1
        if pm.vocab is not None:
            local = pm.vocab.loss_sum(logits, targets)
        else:
            local = token_loss_sum(logits, targets)
        local = local * (dp / n_valid.clamp(min=1).to(local.dtype))
        value = pm.replica_loss(local)  # summed over the token group: the replica's share × dp
        if pm.dp is not None:
            dist.all_reduce(value, group=pm.dp.group)
        return local + (value / dp - local.detach())

    def _queue_grad_sync(self, grad: torch.Tensor) -> torch.Tensor:
        """Backward reached the logits: complete the gradient sync when this backward ends (DDP's callback)."""
        torch.autograd.Variable._execution_engine.queue_callback(self.pm.finish_grad_sync)
        return grad

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """This rank's logits → this replica's [B, S, V] in token order (collective)."""
        return self.pm.full_logits(logits)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight at full shape in Hugging Face's names (collective over each shard's group)."""
        return state_dict_to_hf(self.pm.full_state(grads=False), self.cfg)

    def hf_grads(self) -> dict[str, torch.Tensor]:
        """Every gradient at full shape in Hugging Face's names (collective; after a backward)."""
        return state_dict_to_hf(self.pm.full_state(grads=True), self.cfg)


def parallelize(
    model: nn.Module,
    scheme: str = "tsp",
    degree: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    seq_len: int,
    recompute: str = "none",
    **options: Any,
) -> HFParallel:
    """Shard a Hugging Face LlamaForCausalLM / MistralForCausalLM (the same full weights on every rank) over the
    default process group: `degree` ranks per replica (None: all of them), dp = world / degree replicas. `seq_len`:
    the sequence length of every batch (zigzag schemes need it divisible by 2·degree). `options`: the scheme's
    layout options (ParallelConfig fields, e.g. kv_bucket_heads=1, mlp_exchange="biring", sp_variant="ring");
    vocab defaults to "replicated". Collective; returns this rank's module (its parameters are its shards)."""
    if not dist.is_initialized():
        raise RuntimeError("parallelize needs torch.distributed initialised (torchrun, or init_process_group)")
    world = dist.get_world_size()
    if group is not None and dist.get_world_size(group) != world:
        raise ConfigError(f"group of {dist.get_world_size(group)} ranks: parallelize shards over the whole world only")
    cfg = model_config_from_hf(getattr(model, "config"))  # noqa: B009 - nn.Module's __getattr__ is typed for tensors
    degree = degree or world
    if "replicated" in scheme_of(scheme).vocabs:  # full-vocabulary logits, and a loss that ignores -100 labels
        options.setdefault("vocab", "replicated")
    par = ParallelConfig(scheme=scheme, degree=degree, dp=max(world // degree, 1), recompute=recompute, **options)
    validate_parallel(cfg, par, seq_len, world_size=world)
    first = next(model.parameters())
    device, dtype = first.device, first.dtype
    mesh = build_mesh(par, device.type)
    pm = apply_scheme(cfg, par, ApplyArgs(mesh, seq_len, 0, dtype, device, CommLog(enabled=False)))
    with torch.no_grad():
        load_full_state(pm, state_dict_from_hf(model.state_dict(), cfg))
    return HFParallel(pm, cfg, seq_len, getattr(model, "config"), device)  # noqa: B009


def refuse(ok: torch.Tensor, message: str) -> None:
    """Raise ValueError(message) unless `ok` (a bool scalar) holds. A host tensor is read on the host; a device
    tensor is not read (that would wait for the device every step): torch._assert_async fails the device's stream
    instead, so the error surfaces at the next synchronisation as a device-side assert, without this message."""
    if ok.device.type == "cpu":
        if not bool(ok):
            raise ValueError(message)
    else:
        torch._assert_async(ok, message)


def load_full_state(pm: ParallelModel, full: dict[str, torch.Tensor]) -> None:
    """Overwrite every local parameter with its slice of the full tensor of its reference name (the inverse of
    ParallelModel.unshard: a split over Shard.comm along Shard.dim, a KV head replicated over Shard.replicas
    consecutive ranks, FSDP2's DTensor as its placements say, a replicated weight whole)."""
    for name, p in pm.named_local_params():
        s = pm.shards[name]
        src = full[s.name].to(device=p.device, dtype=p.dtype)
        if isinstance(p.data, DTensor):
            p.data.to_local().copy_(distribute_tensor(src, p.data.device_mesh, p.data.placements).to_local())
            continue
        if s.comm is not None and s.dim is not None:
            parts, index = s.comm.size // s.replicas, s.comm.rank // s.replicas
            src = src.chunk(parts, s.dim)[index]
        p.data.copy_(src)

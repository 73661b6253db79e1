"""Training parity: one case of `python -m tspbench.verify` (scheme vs the single-device model).

Builds the reference and the sharded model from one seed and runs the same global batch through both with
the one training step everything shares (tspbench.schemes.train.train_step: forward, backward, gradient sync,
one AdamW step). Then every rank puts its logits, every parameter gradient (after the sync, before the
update) and every updated parameter back to full shape, and rank 0 compares EVERY rank's copy with the
reference: a tensor's check is the worst rank's error, so one rank whose replicated copy drifted (a gradient
synchronised on rank 0 only, a data-parallel replica left behind) fails the case (tolerances:
tspbench.verify.case).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from tspbench.config import DTYPES
from tspbench.model import build_model, synthetic_batch, token_loss_sum
from tspbench.verify.case import TOL, CaseResult, TensorCheck, VerifyConfig
from tspbench.verify.case import breakage as _breakage
from tspbench.verify.case import check_tensor as _check

LR, WEIGHT_DECAY = 1e-2, 0.1  # a large step, so an optimizer that sees a wrong gradient visibly diverges


@dataclass
class Sharded:
    """The sharded model after the shared training step, and what was observed at its phases."""

    pm: Any
    """The scheme's ParallelModel (parameters updated by the step)."""
    seen: dict[str, Any]
    """loss, logits, full_logits, grads (after the sync, before the update), comm / ops / edges (layer 0's and the
    embedding's and head's collectives of one forward + backward)."""
    saved: list[int]
    """[bytes the forward saved for backward], filled while the step runs."""


@dataclass
class Reference:
    """The single-device model after the same step: logits, loss, gradients, updated parameters."""

    logits: torch.Tensor
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.nn.Parameter]


def run_case(vc: VerifyConfig, breakage: str | None = None) -> CaseResult | None:
    """Collective over the default process group (world = dp × degree). Returns the result on rank 0."""
    par = vc.parallel()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == par.world_size, (world, par.world_size)
    device = torch.device("cuda", torch.cuda.current_device()) if vc.device == "cuda" else torch.device("cpu")
    tokens, targets = synthetic_batch(vc.model, par.dp * vc.batch, vc.seq_len, vc.seed, device)
    sharded = sharded_step(vc, breakage, device, tokens, targets)
    everyone = full_views(sharded, world)
    if rank != 0:
        return None
    ref = reference_step(vc, device, tokens, targets)
    sizes = [r["sizes"] for r in everyone]
    return CaseResult(
        asdict(vc),
        compare(vc, everyone, ref),
        sharded.seen["comm"],
        sharded.seen["ops"],
        sharded.seen["edges"],
        [s[0] for s in sizes],
        [s[1] for s in sizes],
        breakage,
        local_numel=[r["local_numel"] for r in everyone],
    )


def sharded_step(
    vc: VerifyConfig, breakage: str | None, device: torch.device, tokens: torch.Tensor, targets: torch.Tensor
) -> Sharded:
    """The sharded model (with `breakage` applied, if any): the shared training step, observed at its phases."""
    from tspbench.measure.memory import saved_tensor_bytes
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.base import local_tensor
    from tspbench.schemes.comm import CommLog
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    par, dtype = vc.parallel(), DTYPES[vc.dtype]
    log = CommLog(strict=vc.strict)
    mesh = build_mesh(par, device.type)
    seen: dict[str, Any] = {}
    saved = [0]
    with _breakage(breakage):
        pm = apply_scheme(vc.model, par, ApplyArgs(mesh, vc.seq_len, vc.seed, dtype, device, log))
        if vc.grad_bucket_elems:
            pm.grad_bucket_elems = vc.grad_bucket_elems
        tok, tgt, pos = pm.local_batch(tokens, targets)
        opt = MixedPrecisionAdamW(list(pm.parameters()), lr=LR, weight_decay=WEIGHT_DECAY)
        param_keys = {local_tensor(p).untyped_storage().data_ptr() for p in pm.parameters()}
        forward_only = saved_tensor_bytes(param_keys, saved)  # bytes saved for backward by the forward
        forward_only.__enter__()

        def phase(name: str) -> None:
            if name == "backward":
                forward_only.__exit__(None, None, None)
            if name == "grad_sync":  # layer 0's and the edges' collectives of one forward + backward
                seen["comm"] = log.summary("layer0")
                seen["ops"] = [(r.op, r.phase, r.numel, r.recv_numel) for r in log.records if r.tag == "layer0"]
                # + the gradient-sync buckets backward has posted so far (all of them: finish_grad_sync only waits)
                seen["edges"] = {tag: log.summary(tag) for tag in ("embed", "head", "grad_sync")}

        def on_forward(loss: torch.Tensor, logits: torch.Tensor) -> None:
            seen["loss"], seen["logits"] = loss.detach(), logits.detach()

        def on_grads() -> None:  # after the sync, before the update changes the weights the logits came from
            seen["grads"] = {n: p.grad.detach().clone() for n, p in pm.named_local_params() if p.grad is not None}
            seen["full_logits"] = pm.full_logits(seen["logits"])  # (vocab=ring computes them from the head)

        train_step(pm, opt, tok, tgt, pos, phase=phase, on_forward=on_forward, on_grads=on_grads)
    return Sharded(pm, seen, saved)


def full_views(sharded: Sharded, world: int) -> list[dict[str, Any]]:
    """Every rank's view at full shape, gathered on every rank: its replica's loss, logits, gradients, updated
    parameters, (parameter bytes, saved bytes) and local parameter sizes."""
    from tspbench.schemes.base import local_tensor

    pm, seen = sharded.pm, sharded.seen
    replica_loss = pm.replica_loss(seen["loss"])
    if pm.dp is not None:
        pm.dp.check("all_reduce", "replica_loss", replica_loss, reduce_op="sum")
        dist.all_reduce(replica_loss, group=pm.dp.group)
        replica_loss /= pm.dp.size
    mine = {
        "replica": pm.dp.rank if pm.dp is not None else 0,
        "loss": replica_loss.cpu(),
        "logits": seen["full_logits"].cpu(),
        "grads": {k: v.cpu() for k, v in pm.full_state_of(seen["grads"]).items()},
        "params": {k: v.cpu() for k, v in pm.full_state(grads=False).items()},
        "sizes": (pm.param_bytes(), sharded.saved[0]),
        "local_numel": {pm.shards[n].name: local_tensor(p).numel() for n, p in pm.named_local_params()},
    }
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    return everyone


def reference_step(vc: VerifyConfig, device: torch.device, tokens: torch.Tensor, targets: torch.Tensor) -> Reference:
    """The single-device model: same seed, same global batch, same optimizer."""
    from tspbench.schemes.train import MixedPrecisionAdamW

    ref = build_model(vc.model, vc.seed, DTYPES[vc.dtype], device, recompute="none")
    ref_logits = ref(tokens)
    ref_loss = token_loss_sum(ref_logits, targets) / targets.numel()
    ref_loss.backward()
    ref_params = dict(ref.named_parameters())
    ref_grads = {n: _grad(p).detach().clone() for n, p in ref_params.items()}
    ref_opt = MixedPrecisionAdamW(list(ref.parameters()), lr=LR, weight_decay=WEIGHT_DECAY)
    ref_opt.step()
    return Reference(ref_logits, ref_loss, ref_grads, ref_params)  # params: updated in place by the step


def compare(vc: VerifyConfig, everyone: list[dict[str, Any]], ref: Reference) -> list[TensorCheck]:
    """Loss, logits (each rank against its replica's rows), every gradient and (float64) every updated
    parameter: each tensor's check is the worst rank's."""
    tol, world, b = TOL[vc.dtype], len(everyone), vc.batch

    def worst(name: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> TensorCheck:
        """The check of the rank furthest from the reference."""
        return max((_check(name, g, w, tol) for g, w in zip(got, want)), key=lambda c: c.max_rel)

    rows = [slice(r["replica"] * b, (r["replica"] + 1) * b) for r in everyone]
    checks = [
        worst("loss", [r["loss"] for r in everyone], [ref.loss] * world),
        worst("logits", [r["logits"] for r in everyone], [ref.logits[s] for s in rows]),
    ]
    checks += [worst(f"grad/{n}", [r["grads"][n] for r in everyone], [g] * world) for n, g in ref.grads.items()]
    # The AdamW step is compared in float64 only (tspbench.verify.case explains why).
    if vc.optimizer_step and vc.dtype == "float64":
        checks += [worst(f"param/{n}", [r["params"][n] for r in everyone], [p] * world) for n, p in ref.params.items()]
    return checks


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    assert p.grad is not None, "the reference left a parameter without a gradient"
    return p.grad

"""Training parity: one case of `python -m tspbench.verify` (scheme vs the single-device model).

Builds the reference and the sharded model from one seed, runs the same global batch through both
(forward, backward, one AdamW step), gathers the sharded logits, every parameter gradient and every
updated parameter back to full shape and compares them (tolerances: tspbench.verify.case).
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.distributed as dist

from tspbench.config import DTYPES
from tspbench.model import build_model, synthetic_batch, token_loss_sum
from tspbench.verify.case import TOL, CaseResult, VerifyConfig
from tspbench.verify.case import breakage as _breakage
from tspbench.verify.case import check_tensor as _check


def run_case(vc: VerifyConfig, breakage: str | None = None) -> CaseResult | None:
    """Collective over the default process group (world = dp × degree). Returns the result on rank 0."""
    from tspbench.measure.memory import saved_tensor_bytes
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog

    par = vc.parallel()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == par.world_size, (world, par.world_size)
    dtype, tol = DTYPES[vc.dtype], TOL[vc.dtype]
    device = torch.device("cuda", torch.cuda.current_device()) if vc.device == "cuda" else torch.device("cpu")
    tokens, targets = synthetic_batch(vc.model, par.dp * vc.batch, vc.seq_len, vc.seed, device)

    # -- sharded model ---------------------------------------------------------------------------------
    log = CommLog()
    mesh = build_mesh(par, device.type)
    breaker = _breakage(breakage)
    with breaker:
        pm = apply_scheme(vc.model, par, ApplyArgs(mesh, vc.seq_len, vc.seed, dtype, device, log))
        tok, tgt, pos = pm.local_batch(tokens, targets)
        saved = [0]
        param_keys = {p.untyped_storage().data_ptr() for p in pm.parameters()}
        with saved_tensor_bytes(param_keys, saved):
            loss, logits = pm.loss(tok, tgt, pos)
        loss.backward()
        comm_layer0 = log.summary("layer0")
        ops0 = [(r.op, r.phase, r.numel, r.recv_numel) for r in log.records if r.tag == "layer0"]
        edges = {tag: log.summary(tag) for tag in ("embed", "head")}
        pm.finish_grad_sync()
    replica_loss = pm.replica_loss(loss)
    full_logits = pm.full_logits(logits.detach())
    if pm.dp is not None:  # every replica's logits, in replica order
        full_logits = pm.dp.all_gather(full_logits.contiguous(), 0)
        dist.all_reduce(replica_loss, group=pm.dp.group)
        replica_loss /= pm.dp.size
    grads = pm.full_state(grads=True)
    opt_step = vc.optimizer_step and vc.dtype == "float64"
    if opt_step:
        opt = torch.optim.AdamW(pm.parameters(), lr=1e-2, weight_decay=0.1)
        opt.step()
        params = pm.full_state(grads=False)
    sizes: list = [None] * world
    dist.all_gather_object(sizes, (pm.param_bytes(), saved[0]))
    if rank != 0:
        return None

    # -- reference, same seed, same global batch -------------------------------------------------------
    ref = build_model(vc.model, vc.seed, dtype, device, recompute="none")
    ref_logits = ref(tokens)
    ref_loss = token_loss_sum(ref_logits, targets) / targets.numel()
    ref_loss.backward()
    checks = [_check("loss", replica_loss, ref_loss, tol), _check("logits", full_logits, ref_logits, tol)]
    ref_params = dict(ref.named_parameters())
    checks += [_check(f"grad/{n}", grads[n], _grad(p), tol) for n, p in ref_params.items()]
    if opt_step:
        torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1).step()
        checks += [_check(f"param/{n}", params[n], p, tol) for n, p in ref_params.items()]
    return CaseResult(
        asdict(vc), checks, comm_layer0, ops0, edges, [s[0] for s in sizes], [s[1] for s in sizes], breakage
    )


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    assert p.grad is not None, "the reference left a parameter without a gradient"
    return p.grad

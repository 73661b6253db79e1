"""The rank side of tests/hf/test_hf_parallelize.py (spawned by tspbench.spawn: gloo on CPU, float64).

Every rank builds the same Hugging Face model (seeded), runs the unparallelized model through one step (its own
loss over the global batch, backward, torch AdamW) as the reference, and `tspbench.parallelize`'s module through the
same step with the user's loop: out = module(ids, labels=labels); out.loss.backward(); AdamW(module.parameters()).
Rank 0 writes every rank's relative errors (loss, logits, grad/NAME, param/NAME in Hugging Face names) to JSON."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hf_cases import batch, hf_float64, hf_model, rel_err

SEQ, ROWS, LR, WD = 24, 2, 1e-2, 0.1


def _break(name: str | None) -> None:
    """Deliberately broken variants (in this rank only): the converter without the RoPE row permutation, or a
    module whose backward never synchronises gradients (no end-of-backward callback, no bucket hooks)."""
    if name == "no_rope_permutation":
        import tspbench.hf.convert as conv

        conv.rope_from_hf = lambda w, n: w  # type: ignore[assignment]
    elif name == "no_grad_sync":
        from tspbench.hf.parallelize import HFParallel
        from tspbench.schemes.base import ParallelModel

        HFParallel._queue_grad_sync = lambda self, g: g  # type: ignore[method-assign]
        ParallelModel._grad_ready = lambda self, p: None  # type: ignore[method-assign]
    elif name is not None:
        raise ValueError(name)


def one_case(config: dict, scheme: str, degree: int, options: dict[str, Any]) -> dict[str, float]:
    """This rank's errors for one parallelized model against the unparallelized one."""
    from tspbench import parallelize

    world = dist.get_world_size()
    dp = world // degree
    ref = hf_model(config)
    model = copy.deepcopy(ref)
    ids, labels = batch(config["vocab_size"], dp * ROWS, SEQ)
    labels[0, :5] = -100  # ignored labels (padding), so the loss's denominator is not simply B·S
    with hf_float64():
        logits = ref(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters() if p.grad is not None}
    torch.optim.AdamW(list(ref.parameters()), lr=LR, weight_decay=WD).step()

    module = parallelize(model, scheme, degree, seq_len=SEQ, **options)
    out = module(ids, labels=labels)  # every rank passes the whole global batch
    out.loss.backward()
    grads = module.hf_grads()
    full_logits = module.full_logits(out.logits.detach())
    torch.optim.AdamW(list(module.parameters()), lr=LR, weight_decay=WD).step()
    params = module.hf_state_dict()
    replica = module.pm.dp.rank if module.pm.dp is not None else 0
    err = {
        "loss": rel_err(out.loss, loss),
        "logits": rel_err(full_logits, logits[replica * ROWS : (replica + 1) * ROWS]),
    }
    err |= {f"grad/{n}": rel_err(grads[n], g) for n, g in ref_grads.items()}
    err |= {f"param/{n}": rel_err(params[n], p) for n, p in ref.named_parameters()}
    return err


def worker(rank: int, world: int, cases: list[tuple[str, dict, str, int, dict, str | None]], out_file: str) -> None:
    """Run each (case id, config, scheme, degree, options, broken) in this rank group; rank 0 writes
    {case id: [errors of rank 0, rank 1, ...]}."""
    results: dict[str, list[dict[str, float]]] = {}
    for cid, config, scheme, degree, options, broken in cases:
        if broken is not None:  # a broken variant runs last in its group: the patches are not undone
            _break(broken)
        mine = one_case(config, scheme, degree, options)
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        results[cid] = everyone
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))

"""Serving parity: prefill + KV-cache decode of every scheme against the single-device model.

`python -m tspbench.verify scheme=tsp degree=4 decode_steps=4` runs, on each rank group: the scheme's forward
over the first seq_len tokens with a KV cache (the prefill, in the scheme's own token layout), then
`decode_steps` single-token steps at positions seq_len, seq_len+1, … (schemes/ops/decode.py). The reference is
one full forward of the single-device model over all seq_len + decode_steps tokens: the prefill logits must
equal its first seq_len positions, the first token's logits (position S − 1 summed over the sequence group as
the runner takes them, run/loop.py first_token_logits; every rank's copy) that position, and each decode step's
logits its position, within the dtype tolerance of tspbench.verify.parity (a KV cache only changes the order of
the same sums). Also recorded: each rank's KV-cache bytes (the group's sum must equal the reference cache:
nothing duplicated, nothing missing) and the collectives of layer 0 in one decode step.

`greedy=true` generates instead (no teacher forcing): each decode step is fed the argmax of the previous
logits, the first the prefill's last position. The reference generates greedily with full forwards of the
single-device model (no cache); the decode_steps + 1 tokens must be identical (check `greedy_tokens`, on every
rank: each rank's own argmax, so a rank whose replicated logits diverged is caught too) and every step's
logits within tolerance of the reference's last position.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tspbench.config import DTYPES
from tspbench.model import build_model, synthetic_batch
from tspbench.verify.case import TOL, CaseResult, TensorCheck, VerifyConfig
from tspbench.verify.case import breakage as _breakage
from tspbench.verify.case import check_tensor as _check


def run_decode_case(vc: VerifyConfig, breakage: str | None = None) -> CaseResult | None:
    """Collective over the default process group (world = dp × degree). Returns the result on rank 0."""
    from tspbench.run import loop
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.comm import CommLog

    par = vc.parallel()
    dtype, tol, s, n = DTYPES[vc.dtype], TOL[vc.dtype], vc.seq_len, vc.decode_steps
    device = torch.device("cuda", torch.cuda.current_device()) if vc.device == "cuda" else torch.device("cpu")
    tokens, _ = synthetic_batch(vc.model, par.dp * vc.batch, s + n, vc.seed, device)

    log = CommLog(strict=vc.strict)
    with _breakage(breakage), torch.no_grad():
        pm = apply_scheme(vc.model, par, ApplyArgs(build_mesh(par, device.type), s, vc.seed, dtype, device, log))
        pm.start_kv_cache(n)
        tok, _, pos = pm.local_batch(tokens[:, :s], tokens[:, :s])
        local = pm(tok, pos)  # this rank's tokens (and vocabulary slice)
        prefill = _replicas(pm, pm.full_logits(local))  # [dp·B, S, V]
        # the last position's logits as the runner takes them for the first token (run/loop.py prefill)
        first = _replicas(pm, loop.first_token_logits(pm, local, loop.last_index(pos, s)))  # [dp·B, 1, V]
        steps = []
        gen = [first.argmax(-1)]  # [dp·B, 1]: greedy's first token, at position s
        for t in range(s, s + n):
            log.clear()
            fed = gen[-1] if vc.greedy else tokens[:, t : t + 1]
            steps.append(_replicas(pm, pm.full_decode_logits(pm.decode(fed, t))))
            gen.append(steps[-1][:, -1:].argmax(-1))
        comm0 = log.summary("layer0")
        ops0 = [(r.op, r.phase, r.numel, r.recv_numel) for r in log.records if r.tag == "layer0"]
    sizes: list = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, (pm.param_bytes(), pm.kv_cache_bytes(), torch.cat(gen, 1).cpu(), first.cpu()))
    if dist.get_rank() != 0:
        return None

    ref = build_model(vc.model, vc.seed, dtype, device)
    with torch.no_grad():
        if vc.greedy:
            ref_tokens, ref_logits = _greedy_reference(ref, tokens[:, :s], n)
        else:
            ref_logits = ref(tokens)  # [dp·B, S + n, V]
    checks = [
        _check("prefill_logits", prefill, ref_logits[:, :s], tol),
        # every rank's copy (the worst one): a rank whose sum read the wrong memory leaves rank 0's right
        max((_check("first_token_logits", x[3][:, 0], ref_logits[:, s - 1], tol) for x in sizes), key=_rel),
    ]
    if vc.greedy:
        checks += [_same_tokens(f"greedy_tokens/rank{r}", x[2], ref_tokens[:, s:].cpu()) for r, x in enumerate(sizes)]
    checks += [
        _check(f"decode_logits/pos{t}", got[:, 0], ref_logits[:, t], tol) for t, got in zip(range(s, s + n), steps)
    ]
    return CaseResult(
        vc.__dict__ | {"model": vc.model.__dict__},
        checks,
        comm0,
        ops0,
        {},
        [x[0] for x in sizes],
        [],
        breakage,
        [x[1] for x in sizes],
    )


def _rel(c: TensorCheck) -> float:
    return c.max_rel


def _greedy_reference(ref, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-device greedy generation without a cache: n + 1 tokens after the prompt (the first from the
    prompt's last position, then one per decode step). Returns (prompt ‖ generated tokens [B, S + n + 1],
    logits [B, S + n, V] at every position the parallel run produced logits for)."""
    seq = prompt
    for _ in range(n + 1):
        logits = ref(seq)
        seq = torch.cat([seq, logits[:, -1:].argmax(-1)], 1)
    return seq, logits


def _same_tokens(name: str, got: torch.Tensor, ref: torch.Tensor) -> TensorCheck:
    """Exact token equality; max_rel is the fraction of generated tokens that differ."""
    if got.shape != ref.shape:
        return TensorCheck(name, float("inf"), float("inf"), 0.0, False)
    wrong = (got != ref).double().mean().item()
    return TensorCheck(name, wrong, wrong, 0.0, wrong == 0.0)


def _replicas(pm, logits: torch.Tensor) -> torch.Tensor:
    """Every data-parallel replica's logits, in replica order (rows of the global batch)."""
    if pm.dp is None:
        return logits
    return pm.dp.all_gather(logits.contiguous(), 0)

"""`python -m tspbench.gpu_check time=true`: compute-only time on ONE accelerator, and the calibration it yields.

Two measurements, both with CUDA events after warm-up:
1. Rank 0 of an 8-way scheme at the paper's shapes (llama7b, bf16, B = 1) under torch's fake process group: its
   forward and its training step (tspbench.schemes.train.train_step). The collectives are no-ops, so this is the
   rank's **compute-only** time — the part of the step one GPU can measure; never a multi-GPU throughput.
2. Achieved efficiency per op class, as fractions of the hardware profile's bf16 peak, on shapes from the same
   step: a GEMM (the MLP's gate projection of one rank's tokens), the causal attention kernel forward and its
   backward (FLOPs counted as costmodel.flops.hardware_flops_per_token counts them: causal c = ½, the flash backward
   as 2.5 forwards). They go to a calibration file (device name, torch and driver versions, date) that
   `costmodel.hardware.load_hardware` applies when it sits beside the profile as conf/hardware/<name>.calibration.json;
   until someone commits one, the time model uses the datasheet assumption and every modelled record says so.
"""

from __future__ import annotations

import datetime

import torch

from tspbench.config import ModelConfig
from tspbench.parallel import ParallelConfig

CALIBRATION_OPS = ("gemm", "attention_forward", "attention_backward")


def calibration_record(times_s: dict[str, float], flops: dict[str, float], peak: float, device: str) -> dict:
    """The calibration file's content from measured op times (seconds) and their FLOPs (pure: tested on CPU)."""
    eff = {op: flops[op] / (times_s[op] * peak) for op in CALIBRATION_OPS}
    bad = {op: v for op, v in eff.items() if not 0 < v <= 1}
    if bad:
        raise ValueError(f"implausible efficiency (must be in (0, 1] of the bf16 peak {peak:.3g}): {bad}")
    return {
        "device": device,
        "torch": torch.__version__,
        "driver": torch.version.cuda or "",
        "date": datetime.date.today().isoformat(),
        "source": "python -m tspbench.gpu_check time=true",
        "efficiency": eff,
        "op_time_ms": {op: 1e3 * t for op, t in times_s.items()},
    }


def _cuda_time_s(fn, reps: int = 5) -> float:
    fn()  # warm-up (kernel selection, allocator)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def op_calibration(model: ModelConfig, seq_len: int, degree: int, peak: float) -> dict:
    """Time one GEMM and the attention kernel (forward, backward) at rank-0 shapes; the calibration record."""
    import torch.nn.functional as F

    dev, bf16 = "cuda", torch.bfloat16
    tokens = seq_len // degree
    x = torch.randn(tokens, model.dim, device=dev, dtype=bf16)
    w = torch.randn(model.ffn_hidden // degree, model.dim, device=dev, dtype=bf16)
    heads = model.n_heads // degree
    q, k, v = (
        torch.randn(1, heads, seq_len, model.head_dim, device=dev, dtype=bf16, requires_grad=True) for _ in range(3)
    )
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    times = {
        "gemm": _cuda_time_s(lambda: F.linear(x, w)),
        "attention_forward": _cuda_time_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }
    fwd_bwd = _cuda_time_s(
        lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad)
    )
    times["attention_backward"] = max(fwd_bwd - times["attention_forward"], 1e-9)
    attn = 4 * seq_len * seq_len * heads * model.head_dim * 0.5
    flops = {"gemm": 2 * tokens * model.dim * w.shape[0], "attention_forward": attn, "attention_backward": 2.5 * attn}
    return calibration_record(times, flops, peak, torch.cuda.get_device_name())


def rank_step_times(model: ModelConfig, par: ParallelConfig, seq_len: int) -> dict:
    """Rank 0's forward and training step at these shapes, compute only (fake process group), CUDA events."""
    from tspbench.predict.trace import fake_process_group
    from tspbench.schemes import ApplyArgs, apply_scheme, build_mesh
    from tspbench.schemes.train import MixedPrecisionAdamW, train_step

    with fake_process_group(par.world_size, 0):
        pm = apply_scheme(model, par, ApplyArgs(build_mesh(par, "cuda"), seq_len, 0, torch.bfloat16, "cuda"))
        tokens = torch.zeros((par.dp, seq_len), dtype=torch.long, device="cuda")
        tok, tgt, pos = pm.local_batch(tokens, tokens)
        opt = MixedPrecisionAdamW(list(pm.parameters()), lr=1e-5)

        def forward():
            with torch.no_grad():
                pm(tok, pos)

        fwd_s = _cuda_time_s(forward, reps=2)
        step_s = _cuda_time_s(lambda: train_step(pm, opt, tok, tgt, pos), reps=2)
    return {
        "scheme": par.scheme,
        "degree": par.degree,
        "seq_len": seq_len,
        "compute_only_forward_ms": fwd_s * 1e3,
        "compute_only_train_step_ms": step_s * 1e3,
        "note": "rank 0 alone under the fake process group: compute only, collectives are no-ops",
    }


def _time_s(fn, device: str, reps: int = 3) -> float:
    """Seconds per call: CUDA events on a GPU, the wall clock on the CPU (the machinery only)."""
    if device.startswith("cuda"):
        return _cuda_time_s(fn, reps)
    import time

    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def shape_checks(par: ParallelConfig, work, hw, device: str = "cuda") -> list[dict]:
    """Each distinct kernel call one rank of `par` issues in a layer (costmodel/kernels.py attention_calls and
    gemm_calls, backward GEMMs included), timed on `device`, beside the shape model's efficiency for it: one record
    per call shape with the measured and modelled fractions of the profile's bf16 peak and their ratio
    (docs/method.md#fit). On a GPU this is the evidence that replaces the published curves; on the CPU it checks the
    machinery only (its fractions of a GPU peak mean nothing)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    from tspbench.predict.costmodel.kernels import attention_calls, attention_efficiency, gemm_calls, gemm_efficiency

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    peak = hw.peak_flops_bf16
    out: list[dict] = []
    seen: set[tuple[object, ...]] = set()
    for a in attention_calls(par, work):
        key: tuple[object, ...] = ("attention", a.q_tokens, a.k_tokens, a.heads, a.head_dim, a.mask, a.batch)
        if key in seen:
            continue
        seen.add(key)
        q = torch.randn(a.batch, a.heads, a.q_tokens, a.head_dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (
            torch.randn(a.batch, a.heads, a.k_tokens, a.head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2)
        )
        mask = None if a.mask == "unmasked" else causal_lower_right(a.q_tokens, a.k_tokens)

        def fwd(q=q, k=k, v=v, mask=mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        grad = torch.randn_like(fwd())
        t_f = _time_s(fwd, device)
        t_fb = _time_s(lambda fwd=fwd, q=q, k=k, v=v, grad=grad: torch.autograd.grad(fwd(), (q, k, v), grad), device)
        one = a.flops / a.count
        for direction, flops, t in (("fwd", one, t_f), ("bwd", 2.5 * one, max(t_fb - t_f, 1e-9))):
            modelled = attention_efficiency(a.q_tokens, a.k_tokens, a.heads, a.head_dim, a.mask, direction, a.batch, hw)
            out.append(_shape_record(key, direction, a.count, flops, t, peak, modelled))
    for g in gemm_calls(par, work):
        for c in [g, *g.backward()] if work.mode == "train" else [g]:
            key = ("gemm", c.m, c.n, c.k)
            if key in seen:
                continue
            seen.add(key)
            x = torch.randn(c.m, c.k, device=device, dtype=dtype)
            w = torch.randn(c.n, c.k, device=device, dtype=dtype)
            t = _time_s(lambda x=x, w=w: F.linear(x, w), device)
            modelled = gemm_efficiency(c.m, c.n, c.k, "bfloat16", hw)
            out.append(_shape_record(key, c.name, c.count, c.flops / c.count, t, peak, modelled))
    return out


def _shape_record(key: tuple, what: str, count: int, flops: float, t: float, peak: float, modelled: float) -> dict:
    measured = flops / (t * peak)
    return {
        "call": key[0],
        "what": what,
        "shape": list(key[1:]),
        "count_per_layer": count,
        "time_ms": 1e3 * t,
        "measured_efficiency": measured,
        "modelled_efficiency": modelled,
        "measured_over_modelled": measured / modelled if modelled else None,
    }

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

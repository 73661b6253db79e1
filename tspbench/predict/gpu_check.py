"""The estimate against a real allocator, on ONE accelerator (the command is `python -m tspbench.gpu_check`,
tspbench/gpu_check.py).

A rank of a D-way scheme can be run alone: under torch's fake process group the collectives move no data,
but every tensor the rank allocates is real. So one GPU runs rank 0 of llama7b TSP / TP at D = 8 at the
paper's shapes (numbers are garbage, allocations are not), and its CUDA caching-allocator peak
(`torch.cuda.max_memory_allocated`) is set beside the fake-tensor estimate of the same step
(tspbench.predict.estimate, every layer traced) and the closed-form model (tspbench.predict.costmodel). This is the
GPU check of the estimate that a CPU cannot make; it measures memory, never multi-GPU throughput. `time=true`
(tspbench/predict/gpu_time.py) times rank 0's compute only and writes a calibration file.

Setting: the paper one (bf16, AdamW with fp32 master/m/v, full recompute, B = 1), one optimizer step before
the measured step (steady state), as `tspbench.predict.trace.trace_step` does. On CPU (`device=cpu`, a small
model) only the tracker's total of real tensors is compared: the allocator peak needs CUDA.
Output: one JSON line per case on stdout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from tspbench.config import GIB, ModelConfig, model_preset
from tspbench.parallel import ParallelConfig, validate_parallel

CASES = [("tsp", 0, 16384), ("tp", 0, 16384), ("tsp", 0, 65536), ("tp_sp", 2, 16384)]


def check(model: ModelConfig, par: ParallelConfig, seq_len: int, device: str, dtype: str = "bfloat16") -> dict:
    from tspbench.predict.costmodel import Workload, memory_breakdown
    from tspbench.predict.estimate import EstimateOptions, estimate
    from tspbench.predict.trace import Tracing, fake_process_group, trace_step

    validate_parallel(model, par, seq_len)
    t0 = time.perf_counter()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with fake_process_group(par.world_size, 0):
        tr = trace_step(par, Workload(model, seq_len, 1, mode="train", dtype=dtype), Tracing(device=device))
    real = tr.memory()
    out = {
        "scheme": par.scheme,
        "degree": par.degree,
        "tp": par.tp_degree,
        "seq_len": seq_len,
        "model": model.name,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "tracked_real_gib": real["total"] / GIB,
        "tracked_real_phase": real["phase"],
        "cuda_max_allocated_gib": (torch.cuda.max_memory_allocated() - base) / GIB if cuda else None,
        "real_step_s": time.perf_counter() - t0,
    }
    del tr
    est = estimate(
        par,
        Workload(model, seq_len, 1, dtype=dtype),
        EstimateOptions(attention="gpu" if cuda else "native", hardware="h200" if cuda else "cpu"),
    )
    out["estimated_gib"] = est["mem_bytes"]["total"] / GIB
    out["estimated_phase"] = est["peak_phase"]
    out["modelled_gib"] = memory_breakdown(par, Workload(model, seq_len, 1, dtype=dtype))["total"] / GIB
    ref = out["cuda_max_allocated_gib"] or out["tracked_real_gib"]
    out["estimate_vs_real_pct"] = 100 * (out["estimated_gib"] / ref - 1)
    return out


def memory_checks(device: str, recompute: str) -> Iterator[dict]:
    """One record per case: llama7b at the paper's shapes on CUDA; on CPU the machinery on a small model, short
    sequences. A case that runs out of memory is recorded `oom`, and the next one runs."""
    if device.startswith("cuda"):
        model, cases = model_preset("llama7b"), CASES
    else:
        model = ModelConfig(
            name="small_gqa", vocab_size=2048, dim=256, n_layers=4, n_heads=8, n_kv_heads=8, ffn_hidden=1024
        )
        cases = list(dict.fromkeys((s, t, 512) for s, t, _ in CASES))
    for scheme, tp, seq in cases:
        par = ParallelConfig(scheme=scheme, degree=8, tp=tp, recompute=recompute)
        try:
            yield check(model, par, seq, device)
        except torch.OutOfMemoryError as e:
            yield {"scheme": scheme, "seq_len": seq, "status": "oom", "reason": str(e).splitlines()[0]}


def calibration(hardware_peak_flops: float) -> dict:
    """The calibration file's content: the achieved GEMM and attention efficiencies at the paper's call shapes
    (tspbench/predict/gpu_time.py), fractions of the profile's bf16 peak."""
    from tspbench.predict.gpu_time import op_calibration

    return op_calibration(model_preset("llama7b"), 16384, 8, hardware_peak_flops)


def timing_checks(recompute: str) -> Iterator[dict]:
    """Rank 0's compute-only forward and training step time per case (CUDA events; collectives move no data)."""
    from tspbench.predict.gpu_time import rank_step_times

    model = model_preset("llama7b")
    for scheme, tp, seq in CASES:
        par = ParallelConfig(scheme=scheme, degree=8, tp=tp, recompute=recompute)
        try:
            yield rank_step_times(model, par, seq)
        except torch.OutOfMemoryError as e:
            yield {"scheme": scheme, "seq_len": seq, "status": "oom", "reason": str(e).splitlines()[0]}


SHAPE_LAYOUTS = (
    ParallelConfig(scheme="tsp", degree=8),
    ParallelConfig(scheme="tsp", degree=8, kv_bucket_heads=1),
    ParallelConfig(scheme="tp_msp", degree=8),
    ParallelConfig(scheme="sp", degree=8, sp_variant="ulysses"),
    ParallelConfig(scheme="sp", degree=8, sp_variant="ring"),
)
"""The layouts whose kernel calls `shape_cases` times (the headline's sides and the K/V-bucket choice it hinges on)."""


def shape_cases(hardware: str, device: str = "cuda", seq_len: int = 131072) -> Iterator[dict]:
    """Every distinct kernel call of SHAPE_LAYOUTS at llama7b, `seq_len`, training, timed on `device` beside the
    kernel-shape model's efficiency (tspbench/predict/gpu_time.py shape_checks), tagged with its layout."""
    from tspbench.predict.costmodel import Workload, load_hardware
    from tspbench.predict.gpu_time import shape_checks

    hw, model = load_hardware(hardware), model_preset("llama7b")
    named = {"device": torch.cuda.get_device_name()} if device.startswith("cuda") else {}  # what apply_shapes checks
    for par in SHAPE_LAYOUTS:
        try:
            for rec in shape_checks(par, Workload(model, seq_len, 1), hw, device):
                yield {"layout": par.label(), "seq_len": seq_len, "hardware": hardware, **named, **rec}
        except torch.OutOfMemoryError as e:
            yield {"layout": par.label(), "status": "oom", "reason": str(e).splitlines()[0]}

"""The estimate against a real allocator, on ONE accelerator: `python -m tspbench.gpu_check [--device cuda]`.

A rank of a D-way scheme can be run alone: under torch's fake process group the collectives move no data,
but every tensor the rank allocates is real. So one GPU runs rank 0 of llama7b TSP / TP at D = 8 at the
paper's shapes (numbers are garbage, allocations are not), and its CUDA caching-allocator peak
(`torch.cuda.max_memory_allocated`) is set beside the fake-tensor estimate of the same step
(tspbench.predict.estimate, every layer traced) and the closed-form model (tspbench.predict.costmodel). This is the
GPU check of the estimate that a CPU cannot make; it measures memory, never multi-GPU throughput. `--time`
(tspbench/predict/gpu_time.py) times rank 0's compute only and writes a calibration file.

Setting: the paper one (bf16, AdamW with fp32 master/m/v, full recompute, B = 1), one optimizer step before
the measured step (steady state), as `tspbench.predict.trace.trace_step` does. On CPU (`--device cpu`, a small
model) only the tracker's total of real tensors is compared: the allocator peak needs CUDA.
Output: one JSON line per case on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tspbench.config import ModelConfig, model_preset
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
        "tracked_real_gib": real["total"] / 2**30,
        "tracked_real_phase": real["phase"],
        "cuda_max_allocated_gib": (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None,
        "real_step_s": time.perf_counter() - t0,
    }
    del tr
    est = estimate(
        par,
        Workload(model, seq_len, 1, dtype=dtype),
        EstimateOptions(attention="gpu" if cuda else "native", hardware="h200" if cuda else "cpu"),
    )
    out["estimated_gib"] = est["mem_bytes"]["total"] / 2**30
    out["estimated_phase"] = est["peak_phase"]
    out["modelled_gib"] = memory_breakdown(par, Workload(model, seq_len, 1, dtype=dtype))["total"] / 2**30
    ref = out["cuda_max_allocated_gib"] or out["tracked_real_gib"]
    out["estimate_vs_real_pct"] = 100 * (out["estimated_gib"] / ref - 1)
    return out


CalibrationWriter = Callable[[Path, dict], dict]
"""Writes a calibration file and returns it as written: tspbench.record.store.write_json with kind "calibration"
(atomic, efficiencies guarded: docs/records.md#calibration-files), passed in by the entry point tspbench/gpu_check.py
(this module sits below tspbench.record in the layers)."""


def main(argv: list[str] | None = None, *, write_calibration: CalibrationWriter | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tspbench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--recompute", default="full", choices=("none", "full"))
    ap.add_argument(
        "--time",
        action="store_true",
        help="instead of memory: rank 0's compute-only forward and training step time (CUDA events) and the "
        "achieved GEMM / attention efficiencies, written as a calibration file (tspbench/predict/gpu_time.py)",
    )
    ap.add_argument("--hardware", default="h200", help="hardware profile whose bf16 peak the efficiencies divide")
    ap.add_argument(
        "--calibration-out",
        default=None,
        help="where to write <hardware>.calibration.json (default: the current directory; commit it beside "
        "conf/hardware/<hardware>.yaml to make the time model use it)",
    )
    args = ap.parse_args(argv)
    if args.time:
        return _time(args, write_calibration)
    if args.device.startswith("cuda"):
        model = model_preset("llama7b")
        cases = CASES
    else:  # the machinery on CPU: a small model, short sequences
        model = ModelConfig(
            name="small_gqa", vocab_size=2048, dim=256, n_layers=4, n_heads=8, n_kv_heads=8, ffn_hidden=1024
        )
        cases = list(dict.fromkeys((s, t, 512) for s, t, _ in CASES))
    for scheme, tp, seq in cases:
        par = ParallelConfig(scheme=scheme, degree=8, tp=tp, recompute=args.recompute)
        try:
            rec = check(model, par, seq, args.device)
        except torch.OutOfMemoryError as e:
            rec = {"scheme": scheme, "seq_len": seq, "status": "oom", "reason": str(e).splitlines()[0]}
        print(json.dumps(rec), flush=True)
    return 0


def _time(args, write_calibration: CalibrationWriter | None) -> int:
    from tspbench.predict.costmodel.hardware import load_hardware
    from tspbench.predict.gpu_time import op_calibration, rank_step_times

    if not (args.device.startswith("cuda") and torch.cuda.is_available()):
        print(
            "tspbench.gpu_check: --time needs a CUDA device (compute-only timing with CUDA events); "
            f"device={args.device} and torch.cuda.is_available()={torch.cuda.is_available()}",
            file=sys.stderr,
        )
        return 2
    if write_calibration is None:
        print(
            "tspbench.gpu_check: --time writes its calibration file through tspbench.record (atomic, guarded); "
            "run it as `python -m tspbench.gpu_check --time`",
            file=sys.stderr,
        )
        return 2
    model, hw = model_preset("llama7b"), load_hardware(args.hardware)
    calib = op_calibration(model, 16384, 8, hw.peak_flops_bf16)
    out = Path(args.calibration_out or ".") / f"{args.hardware}.calibration.json"
    written = write_calibration(out, calib)
    marks = {k: written[k] for k in ("status", "reason") if k in written}
    print(json.dumps({"calibration": str(out), **marks, **calib["efficiency"]}), flush=True)
    for scheme, tp, seq in CASES:
        par = ParallelConfig(scheme=scheme, degree=8, tp=tp, recompute=args.recompute)
        try:
            rec = rank_step_times(model, par, seq)
        except torch.OutOfMemoryError as e:
            rec = {"scheme": scheme, "seq_len": seq, "status": "oom", "reason": str(e).splitlines()[0]}
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

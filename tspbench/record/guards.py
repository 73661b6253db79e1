"""Plausibility guards: every record is checked before it is written (store.append_record).

Checks, each only where the record carries the numbers it needs:
    mfu          MFU / HFU ≤ 100 %
    flops_bound  tokens/s per device × the model's FLOPs per token (causal-halved, the smallest count) ≤ the
                 device's peak FLOP/s (metrics.peak_flops, else the hardware profile's bf16/fp32 peak)
    capacity     an `ok` record's peak memory (allocator peak, or the breakdown total) ≤ the device's capacity
    params       each rank's parameter bytes (metrics.mem_params_gib) = the scheme's promise
                 (costmodel params_per_device × bytes per element), within PARAMS_RTOL
    comm         layer 0's forward bytes (metrics.comm_bytes_per_layer_fwd, measured) = the formula
                 (costmodel comm_per_layer fwd_total × bytes per element), within COMM_RTOL
A record that fails any check gets status `implausible` and the reasons joined in `reason`; its original
status goes to `status_before_guards`. Speed-ups and savings are computed only from `ok` records
(report.frame / record.tables filter on status), so an implausible record never enters a ratio.
"""

from __future__ import annotations

from typing import Any

from tspbench.config import GIB, ModelConfig
from tspbench.parallel import ParallelConfig
from tspbench.predict.costmodel import (
    BYTES,
    Workload,
    comm_per_layer,
    flops_per_token,
    load_hardware,
    params_per_device,
)

PARAMS_RTOL = 0.02  # allocator-free byte counts; 2 % leaves room for small buffers counted as parameters
COMM_RTOL = 1e-6  # counted bytes vs the formula: exact up to float rounding (tests/parity/test_accounting.py)
MFU_KEYS = ("mfu_causal_pct", "mfu_noncausal_pct", "hfu_pct")
TPS_KEYS = (
    "tokens_per_s_per_device",
    "predicted_tokens_per_s_per_device",
    "predicted_tokens_per_s_per_device_ideal_overlap",
)
MEM_KEYS = ("peak_allocated_gib", "peak_reserved_gib", "device_used_gib", "mem_total_gib")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _model(rec: dict[str, Any]) -> ModelConfig | None:
    cfg = rec.get("model_cfg")
    if not isinstance(cfg, dict):
        return None
    try:
        return ModelConfig(**cfg)
    except TypeError:
        return None


def _parallel(rec: dict[str, Any]) -> ParallelConfig | None:
    try:
        return ParallelConfig.from_record(rec)
    except (KeyError, TypeError, ValueError):
        return None


def _hardware(rec: dict[str, Any]):
    name = rec.get("hardware")
    if not name:
        return None
    try:
        return load_hardware(str(name))
    except (ValueError, OSError):
        return None


def check(rec: dict[str, Any]) -> list[str]:
    """The reasons the record is implausible (empty: plausible or nothing to check)."""
    m = rec.get("metrics") or {}
    out: list[str] = []
    for k in MFU_KEYS:
        v = _num(m.get(k))
        if v is not None and v > 100.0:
            out.append(f"{k}={v:.1f} > 100%")

    model, par, hw = _model(rec), _parallel(rec), _hardware(rec)
    dtype = rec.get("dtype") or "bfloat16"
    peak = _num(m.get("peak_flops"))
    if peak is None and hw is not None and dtype in BYTES:
        peak = hw.peak_flops(dtype)
    if model is not None and peak and rec.get("mode") in ("train", "forward") and rec.get("seq_len"):
        fpt = flops_per_token(model, int(rec["seq_len"]), mode=rec["mode"], causal_halved=True)
        for k in TPS_KEYS:
            v = _num(m.get(k))
            if v is not None and v * fpt > peak * (1 + 1e-9):
                out.append(f"{k}={v:.4g} needs {v * fpt:.3g} FLOP/s > peak {peak:.3g} FLOP/s per device")

    cap = _num(m.get("device_capacity_gib"))
    if cap is None and hw is not None and rec.get("device") != "cpu":
        cap = hw.mem_bytes / GIB
    if cap is not None and rec.get("status") == "ok":
        for k in MEM_KEYS:
            v = _num(m.get(k))
            if v is not None and v > cap * (1 + 1e-9):
                out.append(f"{k}={v:.2f} GiB > device capacity {cap:.2f} GiB in an ok run")

    if model is not None and par is not None and dtype in BYTES:
        got = _num(m.get("mem_params_gib"))
        if got is not None:
            want = params_per_device(model, par) * BYTES[dtype] / GIB
            if want > 0 and abs(got - want) > PARAMS_RTOL * want:
                out.append(f"mem_params_gib={got:.4g} but {par.scheme} at degree {par.degree} promises {want:.4g}")
        got = _num(m.get("comm_bytes_per_layer_fwd"))
        if got is not None and rec.get("method") == "measured" and rec.get("mode") in ("train", "forward"):
            b, s = int(rec.get("batch") or 1), int(rec.get("seq_len") or 0)
            want = comm_per_layer(par, Workload(model, s, b, mode=rec["mode"]))["fwd_total"] * BYTES[dtype]
            if abs(got - want) > COMM_RTOL * max(want, 1.0):
                out.append(f"comm_bytes_per_layer_fwd={got:.6g} but the formula gives {want:.6g}")
    return out


def guard(rec: dict[str, Any]) -> dict[str, Any]:
    """The record, marked `implausible` (status, reason) when a check fails; unchanged otherwise."""
    if rec.get("status") not in ("ok", "oom"):  # failed / timeout / invalid carry no numbers to check
        return rec
    reasons = check(rec)
    if not reasons:
        return rec
    out = dict(rec)
    out["status_before_guards"] = rec["status"]
    out["status"] = "implausible"
    out["reason"] = "; ".join(reasons)
    return out
